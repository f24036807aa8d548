#!/bin/bash
# First start of docker-compose.yaml's Postgres: a role per use, each with exactly what it needs (the statements
# `reclock grants` prints; tests/unit/test_compose.py checks they are these): reclock_app owns the reclock schema
# of the database reclock and nothing else, reclock_cdc has REPLICATION and SELECT on the tables the demo_shop
# source publishes, airflow owns its own database. The passwords come from the environment (.env) through psql's
# \getenv, never an argument; `reclock migrate` (airflow-init) creates the tables in the reclock schema.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username postgres <<'SQL'
\getenv reclock_password RECLOCK_DB_PASSWORD
\getenv cdc_password RECLOCK_CDC_PASSWORD
\getenv airflow_password AIRFLOW_DB_PASSWORD
CREATE ROLE reclock_app LOGIN PASSWORD :'reclock_password';
CREATE ROLE reclock_cdc LOGIN PASSWORD :'cdc_password';
CREATE ROLE airflow LOGIN PASSWORD :'airflow_password';
CREATE DATABASE reclock;
CREATE DATABASE airflow OWNER airflow;
CREATE DATABASE demo_shop;  -- the upstream of include/reclock.yaml's demo_shop source
\connect reclock
REVOKE ALL ON DATABASE "reclock" FROM PUBLIC;
GRANT CONNECT ON DATABASE "reclock" TO "reclock_app";
CREATE SCHEMA reclock AUTHORIZATION "reclock_app";
ALTER ROLE "reclock_app" IN DATABASE "reclock" SET search_path = reclock;
\connect demo_shop
CREATE TABLE orders (order_id int8 PRIMARY KEY, customer text NOT NULL, status text NOT NULL,
                     amount numeric(10,2) NOT NULL, placed_at timestamptz NOT NULL);
CREATE TABLE items (item_id int8 PRIMARY KEY, order_id int8 NOT NULL, sku text NOT NULL, quantity int4 NOT NULL);
ALTER TABLE orders REPLICA IDENTITY FULL;
ALTER TABLE items REPLICA IDENTITY FULL;
CREATE PUBLICATION demo_shop_pub FOR TABLE public.orders, public.items;
ALTER ROLE "reclock_cdc" REPLICATION;
GRANT CONNECT ON DATABASE "demo_shop" TO "reclock_cdc";
GRANT USAGE ON SCHEMA "public" TO "reclock_cdc";
GRANT SELECT ON TABLE "public"."orders" TO "reclock_cdc";
GRANT SELECT ON TABLE "public"."items" TO "reclock_cdc";
SQL
