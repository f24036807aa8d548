-- a status row names the step it was recorded at, the Airflow run that recorded it (null outside Airflow)
-- and, for a failure, a short trace beside the one-line error (reclock.explain)
ALTER TABLE reclock.status_history ADD COLUMN step text, ADD COLUMN run_id text, ADD COLUMN trace text;
