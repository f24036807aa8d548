"""How a Reclock process ends once its work is done: :func:`leave`."""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn


def leave(code: object) -> NoReturn:
    """End the process with ``code`` (as ``sys.exit`` takes it: None is 0, anything but a number is printed
    to stderr and is 1) once the exit handlers ran and the output is flushed, without tearing the
    interpreter down.

    pyarrow reads a Python file object (an object store's file, as s3fs gives it) from its own threads, and
    one of them may let go of it only after the read returned. If that happens while the interpreter is torn
    down, the thread needs the interpreter that is going away and the process aborts (``terminate called
    without an active exception``, exit -6) after the work was done: half the runs of a script that reads a
    part with ``pq.read_table`` and exits end so (apache/arrow#34314, #39862). Local parts are read as native
    files (``persist.blob.native_file``), which need no interpreter; this covers the rest. Airflow's task
    processes end the same way. A thread still running (a lag probe past its deadline) is not waited for."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    status = 0 if code is None else code
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - what the teardown would have run first
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                if stream is sys.stdout and not status:
                    status = 120  # the output is lost: Python's own exit says so with 120 too
        os._exit(status)
