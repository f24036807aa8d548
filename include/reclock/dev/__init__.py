"""The local stack: Postgres, a KRaft Kafka broker, a Spark Connect server and Airflow 3, each started
as a local process on 127.0.0.1, with all state under one folder (``.reclock/`` by default).

``reclock dev up`` / ``down`` / ``status`` / ``logs`` drive :mod:`reclock.dev.stack`; tests start the
pieces they need through the same functions with a state folder of their own.
"""
