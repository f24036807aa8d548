# The Airflow image of docker-compose.yaml: Airflow with Reclock and its dependencies installed, and a Java
# runtime for the Spark drivers that run beside a task (spark_jobs/ through spark-submit in client mode).
ARG AIRFLOW_VERSION=3.3.2
FROM apache/airflow:${AIRFLOW_VERSION}-python3.11
ARG AIRFLOW_VERSION

USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*

USER airflow
# the simple auth manager's password file (airflow-init writes it into the airflow-auth volume, which takes
# this folder's owner on first use)
RUN mkdir -p /opt/airflow/auth
COPY --chown=airflow:0 pyproject.toml README.md /opt/reclock/
COPY --chown=airflow:0 include/reclock /opt/reclock/include/reclock
# apache-airflow pinned again so pip keeps the image's Airflow; s3fs: Python reads parts from s3://
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" /opt/reclock s3fs
