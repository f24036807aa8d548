#!/bin/bash
# First start of docker-compose.yaml's Postgres: Reclock's consensus database, the demo_shop source's upstream
# and Airflow's metadata database, each owned by its own role; the passwords come from the environment (.env). `reclock migrate` (the
# airflow-init service) creates the reclock schema.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username postgres \
     -v reclock_password="$RECLOCK_DB_PASSWORD" -v airflow_password="$AIRFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE reclock LOGIN REPLICATION PASSWORD :'reclock_password';
CREATE DATABASE reclock OWNER reclock;
CREATE DATABASE demo_shop OWNER reclock;  -- the upstream of include/reclock.yaml's demo_shop source
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER airflow;
SQL
