"""Airflow wiring: DAG factories and the mapping from Airflow connections to Reclock settings.

DAG files under ``dags/`` call these factories and nothing else; every task calls a plain library
function that a test can call without Airflow.
"""
