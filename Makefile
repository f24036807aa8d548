# The two commands of the README:
#   make demo   set up everything, bring the local stack up, smoke-check it, run ingest cycles through Airflow
#   make test   set up everything, run the test suite (what .ci/run calls)
# make test-deployment: the long deployment-shaped fault tests (their short versions are in make test)
# and the stack's own: make up / down / status / logs.

VENV := .venv/bin
PYTEST_ARGS ?=
# make test runs the suite in two pytest-xdist workers (the stack-starting tests in one group, first, on one of
# them: tests/conftest.py's xdist_scope); TEST_WORKERS=0 runs it in one process
TEST_WORKERS ?= 2

.PHONY: setup demo test test-unit test-deployment bench up down status logs clean

setup:
	@bash scripts/bootstrap.sh

demo: setup
	@$(VENV)/reclock demo

test: setup
	@SPARK_LOCAL_IP=127.0.0.1 $(VENV)/pytest -n $(TEST_WORKERS) --max-worker-restart 0 --no-loadscope-reorder $(PYTEST_ARGS)

bench: setup
	@SPARK_LOCAL_IP=127.0.0.1 $(VENV)/python -m benchmarks.run --size $(or $(SIZE),quick) --reps $(or $(REPS),1)

test-deployment: setup
	@SPARK_LOCAL_IP=127.0.0.1 $(VENV)/pytest --deployment -m deployment $(PYTEST_ARGS)

test-unit: setup
	@$(VENV)/pytest tests/unit $(PYTEST_ARGS)

up: setup
	@$(VENV)/reclock dev up

down:
	@$(VENV)/reclock dev down

status:
	@$(VENV)/reclock dev status

logs:
	@$(VENV)/reclock dev logs

clean: down
	rm -rf .reclock/postgres .reclock/kafka .reclock/spark .reclock/airflow .reclock/blobs .reclock/stack.json
