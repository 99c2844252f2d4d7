-- Run once by the official postgres image when its data volume is empty (docker-entrypoint-initdb.d),
-- as POSTGRES_USER: Dagster's storage gets a database of its own next to the outbox's, named as
-- `outbox-pipelines dev` names it ('<outbox database>_dagster', outbox_pipelines/defs/dagster_home.py).
CREATE DATABASE outbox_dagster;
