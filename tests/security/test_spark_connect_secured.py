"""Spark Connect with a token behind a TLS front (the dev stack's shape, ``LocalSparkConnect(token=...,
tls=True)``): a client with the token over TLS is served; one without it, with a wrong one, or going round
the front to the server's own port is refused with Spark's reason. (The whole secured stack, Airflow's
tasks on it included, runs in tests/stack/test_secured_stack.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reclock.dev.spark import LocalSparkConnect
from reclock.dev.tls import LocalCA

CLIENT = ("import sys; from reclock.spark.connect import remote_session\n"
          "try:\n  print('SERVED', remote_session(sys.argv[1]).range(3).count())\n"
          "except Exception as e:\n  print(type(e).__name__, str(e)[:400])")


@pytest.mark.timeout(600)
def test_a_client_needs_the_token_over_tls(stack_state):
    server = LocalSparkConnect(stack_state, master="local[1]", driver_memory="768m", name="spark_secure",
                               token=stack_state.secret("secure_spark_connect_token"), tls=True)
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(LocalCA(stack_state).cert)}
    try:
        server.start()
        front = server.url.split(";token=")[0]
        cases = ((server.url, "SERVED 3"), (front, "No authentication token provided"),
                 (front + ";token=not-the-token", "Invalid authentication token"),
                 (f"sc://127.0.0.1:{server.port}", "No authentication token provided"))
        for url, words in cases:
            out = subprocess.run([sys.executable, "-c", CLIENT, url], capture_output=True, text=True, env=env,
                                 timeout=180)
            assert words in out.stdout, (url.split(";token=")[0], out.stdout + out.stderr[-2000:])
            assert server.token not in out.stdout + out.stderr
    finally:
        server.stop()
