"""What a failure says to an operator: one readable line, and a short trace kept beside it.

A step that fails records ``stalled`` with :func:`summary` (``reclock.persist.status``), the page and
``reclock status`` show it, and the ``reclock`` command prints it instead of a traceback. A Spark error's
text carries the JVM's stack (a hundred lines and more) after its message, a Python one its chained causes:
the line is the message alone (Spark's ``[ERROR_CLASS] ...`` line, at most :data:`MAX_MESSAGE` characters),
the trace the innermost :data:`TRACE_FRAMES` Python frames and the first :data:`JVM_FRAMES` JVM frames.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

MAX_MESSAGE = 600
TRACE_FRAMES = 6
JVM_FRAMES = 3
_JVM_CUT = re.compile(r"\n\s*(JVM stacktrace:|\tat |at org\.apache\.|at java\.|at scala\.)")


@dataclass(frozen=True)
class Summary:
    message: str  # one line: the exception's type (unless it is Reclock's own) and its message
    trace: str  # a few lines: where it happened


def _message_text(e: BaseException) -> str:
    text = str(e) or repr(e)
    head = _JVM_CUT.split(text, maxsplit=1)[0]
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    line = " ".join(lines[:3]) if lines else type(e).__name__
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def _jvm_frames(e: BaseException) -> list[str]:
    text = str(e)
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("at ")][:JVM_FRAMES]


def summary(e: BaseException) -> Summary:
    """``e`` as one line and a short trace."""
    from reclock.errors import ReclockError

    text = _message_text(e)
    message = text if isinstance(e, ReclockError) else f"{type(e).__name__}: {text}"
    frames = traceback.extract_tb(e.__traceback__)[-TRACE_FRAMES:] if e.__traceback__ else []
    trace = [f"{f.filename.rsplit('/', 2)[-1] if '/' in f.filename else f.filename}:{f.lineno} in {f.name}"
             for f in frames]
    trace += [f"jvm: {ln}" for ln in _jvm_frames(e)]
    cause = e.__cause__ or (e.__context__ if not e.__suppress_context__ else None)
    if cause is not None and not isinstance(e, ReclockError):
        trace.append(f"caused by {type(cause).__name__}: {_message_text(cause)[:200]}")
    return Summary(message, "\n".join(trace))
