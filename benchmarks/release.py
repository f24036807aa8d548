"""The previous release, installed from the repository's own history (``tests/integration/test_upgrade.py`` and the
fault campaign's ``upgrade``, ``benchmarks.chaos``): its wheel built from the commit that
ended it and installed, alone, into a venv of its own (cached under ``.reclock/cache``), so a test can write
state with it and continue with the checkout.

Which commit ends the previous release: the repository has no tags and its version never moved (0.1.0), so a
release is what landed on main at the end of a round of work, verified by a full suite on a fresh clone.
Round 2 ended at ``0422d11`` ("landed · CI passed", the issue tracker's stop 28): main's HEAD when round 3
began, and the state every deployment of round 2 runs. The next release moves :data:`PREVIOUS_RELEASE`.

The venv sees the checkout venv's dependencies through a ``.pth`` line (as ``test_package`` does): a release
pins the same Airflow, Spark and client versions, and reinstalling them would cost minutes. A ``.pth`` line
processes none of that folder's own ``.pth`` files, so the checkout's editable install stays out of sight.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import io
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PREVIOUS_RELEASE = "0422d11211d55077fa282cf4dcdf3b2f6aeb2e8b"


_PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def build_wheel(src: Path, dist: Path, timeout: float = 300) -> Path:
    """The reclock wheel built from the sources in ``src`` (pyproject.toml, README.md, include/reclock) into
    ``dist``, without its dependencies."""
    subprocess.run([*_PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), f"{src}/"],
                   check=True, capture_output=True, timeout=timeout)
    (wheel,) = dist.glob("reclock-*.whl")
    return wheel


def install_alone(wheel: Path, venv: Path) -> Path:
    """A new venv at ``venv`` holding ``wheel`` alone, its dependencies seen from this interpreter's
    site-packages (a .pth), so its ``bin/python`` imports that wheel's ``reclock`` and nothing of the checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([*_PIP, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return venv


def previous_release(cache: Path | None = None, commit: str = PREVIOUS_RELEASE) -> Path:
    """The venv of ``commit``'s wheel (built and installed on first use, then reused); its ``bin/reclock`` is
    that release's command and its ``bin/python`` imports that release's ``reclock``. Processes that ask at
    once (``make test``'s two workers: ``test_upgrade`` and the short campaign) take turns on a lock file: the
    first builds, the others wait and reuse its venv."""
    root = (cache or REPO / ".reclock" / "cache") / f"release-{commit[:12]}-py{sys.version_info[0]}{sys.version_info[1]}"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _build_release(root, commit)


def _build_release(root: Path, commit: str) -> Path:
    venv, done = root / "venv", root / "installed"
    if done.exists() and (venv / "bin" / "reclock").exists():
        return venv
    shutil.rmtree(root, ignore_errors=True)
    src = root / "src"
    src.mkdir(parents=True)
    have = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if have.returncode != 0:
        raise RuntimeError(f"the previous release's commit {commit} is not in this clone's history (a shallow "
                           "clone?): `git fetch --unshallow` or clone the whole repository")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, "pyproject.toml",
                              "README.md", "include/reclock"], check=True, capture_output=True, timeout=120).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(src, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    wheel = build_wheel(src, root / "dist", timeout=600)
    install_alone(wheel, venv)
    shutil.rmtree(src)
    done.write_text(f"{commit}\n{wheel.name}\n")
    return venv


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a release's command: no PYTHONPATH (the checkout must not leak in), no RECLOCK_* or
    Airflow settings of the test session, then ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECLOCK_", "AIRFLOW", "PYTHON", "PYSPARK", "SPARK_HOME"))}
    env.update({"SPARK_LOCAL_IP": "127.0.0.1", **extra})
    return env
