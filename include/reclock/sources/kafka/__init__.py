"""The kafka source kind (see ``reclock.sources.base``; the kind object is ``kind.py``'s)."""
