"""Smoke checks of a running dev stack: each proves its service does the real thing Reclock needs (the
service checks are the health DAG's, ``reclock.orchestration.health``; Airflow's is the stack's own)."""

from __future__ import annotations

from reclock.orchestration.health import check_kafka, check_postgres, check_spark_connect

__all__ = ["check_airflow", "check_kafka", "check_postgres", "check_s3", "check_spark_connect"]


def check_airflow(airflow) -> str:
    """The API answers with a login and lists the DAGs parsed from the project's folder."""
    dags = airflow.api("GET", "dags?limit=100")
    ids = sorted(d["dag_id"] for d in dags.get("dags", []))
    errors = airflow.api("GET", "importErrors").get("import_errors", [])
    if errors:
        raise RuntimeError(f"airflow: DAG import errors: {errors}")
    return f"API answered; DAGs: {', '.join(ids) or '(none yet)'}"


def check_s3(s3) -> str:
    """moto's server answers S3 (a round trip of an object) and SQS (a queue's attributes)."""
    import uuid

    c = s3.client()
    key = f"_smoke/{uuid.uuid4().hex}"
    c.put_object(Bucket=s3.bucket, Key=key, Body=b"ok")
    if c.get_object(Bucket=s3.bucket, Key=key)["Body"].read() != b"ok":
        raise RuntimeError("s3: an object read back differs from what was written")
    c.delete_object(Bucket=s3.bucket, Key=key)
    url, _ = s3.queue("reclock-smoke")
    s3.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return f"S3 round trip in bucket {s3.bucket} and SQS queue on {s3.endpoint_url}"
