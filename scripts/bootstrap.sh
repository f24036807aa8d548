#!/usr/bin/env bash
# Installs everything Reclock needs on a fresh Debian machine, idempotently:
#   system tools (Java 17+, Maven, Node.js and npm) when missing, a virtualenv in .venv with the pinned
#   Python packages,
#   the PostgreSQL server (Debian's package) when missing, the JVM jars from Maven Central, and Debian's
#   chromium for the browser test of the Airflow UI pages (tests/stack/test_status_ui.py; about 30 s once).
# Re-running it is cheap: each step checks first.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
command -v mvn  >/dev/null 2>&1 || need_apt+=(maven)
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)   # the local Kinesis endpoint (kinesalite, from npm)
command -v npm  >/dev/null 2>&1 || need_apt+=(npm)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    need_apt+=(chromium)
  else  # optional: without it the browser test is skipped
    echo "bootstrap: no chromium; the UI browser test will be skipped (as root: apt-get install chromium)" >&2
  fi
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: missing ${need_apt[*]}; install them (as root: apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
  echo "bootstrap: apt-get install ${need_apt[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# Go 1.23+ builds Toxiproxy (the tests' network faults) from its Go module (`reclock dev install`); Debian's
# golang-go is older, so it comes with the machine (/usr/local/go on ours)
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then export PATH="$PATH:/usr/local/go/bin"; fi
command -v go >/dev/null 2>&1 || echo "bootstrap: no Go toolchain: Toxiproxy cannot be built; install Go 1.23+" >&2

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PY --version)"
  $PY -m venv .venv
  .venv/bin/pip install -q --upgrade pip wheel
fi
stamp=.venv/.reclock-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: pip install -e '.[test]' (pinned: apache-airflow==3.3.2, pyspark==4.2.0, pandas<3)"
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

.venv/bin/reclock dev install
echo "bootstrap: done in $(( $(date +%s) - t0 ))s"
