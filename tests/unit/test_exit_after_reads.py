"""A process that read parts exits with its own status: pyarrow reads a Python file object from its own
threads, and one of them letting go of it while the interpreter is torn down aborts the process (``terminate
called without an active exception``, exit -6) after its work was done. Half the runs of a script that
reads a part with ``pq.read_table(open(path, "rb"))`` and exits so end, on this machine quiet or busy; so each
check runs its script RUNS times (a broken one passes them all about once in 2**RUNS)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.persist.blob import FsspecBlobStore, LocalBlobStore

RUNS = 8


def _part(root) -> None:
    n = 100_000
    pq.write_table(pa.table({"a": range(n), "b": [str(i) for i in range(n)], "c": [i / 7 for i in range(n)]}),
                   root / "p.parquet", row_group_size=10_000)


def _runs(code: str, *args: str, runs: int = RUNS) -> list[subprocess.CompletedProcess]:
    return [subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                           timeout=120) for _ in range(runs)]


def test_a_local_blob_is_a_native_file(tmp_path):
    _part(tmp_path)
    for store in (LocalBlobStore(tmp_path), FsspecBlobStore(f"file://{tmp_path}")):
        with store.open("p.parquet") as f:
            assert isinstance(f, pa.NativeFile)
            assert pq.ParquetFile(f).metadata.num_rows == 100_000
            assert f.seek(0, 2) == (tmp_path / "p.parquet").stat().st_size
            f.seek(0)
            assert f.read(4) == b"PAR1"
        with pytest.raises(FileNotFoundError):
            store.open("nope.parquet")


def test_a_process_that_read_parts_of_a_local_store_exits_cleanly(tmp_path):
    _part(tmp_path)
    code = """
        import sys
        import pyarrow.parquet as pq
        from reclock.persist.blob import LocalBlobStore

        with LocalBlobStore(sys.argv[1]).open("p.parquet") as f:
            print(pq.read_table(f).num_rows)
    """
    for out in _runs(code, str(tmp_path)):
        assert (out.returncode, out.stdout, out.stderr) == (0, "100000\n", "")


def test_the_command_exits_with_its_status_whatever_pyarrow_still_holds(tmp_path):
    """``reclock.exiting.leave`` (how the command and the Spark jobs end) after a read of a Python file object
    (an object store's, as s3fs gives it): the exit handlers ran, the output is there, the status is the
    command's."""
    _part(tmp_path)
    code = """
        import atexit, sys
        import pyarrow.parquet as pq
        from reclock.exiting import leave

        atexit.register(print, "handlers ran")
        with open(sys.argv[1], "rb") as f:
            print(pq.read_table(f).num_rows, end=" ")
        leave(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
    """
    for status, want, err, runs in (("0", 0, "", RUNS), ("3", 3, "", 1), ("refused", 1, "refused\n", 1)):
        for out in _runs(code, str(tmp_path / "p.parquet"), status, runs=runs):
            assert (out.returncode, out.stdout, out.stderr) == (want, "100000 handlers ran\n", err)
