"""Dagster's own storage under a team's login that may create neither a database nor a schema.

docs/deploy.md runs the Dagster code location as a login in ``outbox_maintainer``. Such a login cannot make
``<outbox db>_dagster`` (no CREATEDB) nor the schema ``dagster`` in the outbox's database (no CREATE on it), which
``outbox-pipelines dev`` and the project's dagster.yaml fall back to. It is told the statement the database's owner
runs, and once that has run, Dagster makes its tables in that schema as the login.
"""

import psycopg
import pytest
from dagster_postgres import DagsterPostgresStorage
from psycopg import sql

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage import roles
from outbox_pipelines.defs.dagster_home import DAGSTER_PG_URL_ENV, dagster_storage_url
from outbox_pipelines_tests.core.storage.test_roles import granted, login_as  # noqa: F401 (fixtures)


def test_a_maintainer_login_is_told_the_owner_s_statement_then_dagster_stores_in_schema_dagster(
    db_url,
    login_as,  # noqa: F811
) -> None:
    url = login_as(roles.MAINTAINER)
    login = psycopg.conninfo.conninfo_to_dict(url)["user"]
    password = psycopg.conninfo.conninfo_to_dict(url)["password"]
    with pytest.raises(ConfigError) as refused:
        dagster_storage_url(url)
    told = str(refused.value)
    assert DAGSTER_PG_URL_ENV in told and password not in told
    statement = told.rsplit(": ", 1)[-1]
    assert statement == f'CREATE SCHEMA IF NOT EXISTS dagster; GRANT USAGE, CREATE ON SCHEMA dagster TO "{login}"'

    with psycopg.connect(db_url, autocommit=True) as owner:  # the test database's owner
        owner.execute(statement)  # as told: two statements, no parameters
    storage_url = dagster_storage_url(url)
    assert storage_url.startswith("postgresql+psycopg2://") and "search_path%3Ddagster" in storage_url

    storage = DagsterPostgresStorage(postgres_url=storage_url)  # creates Dagster's tables, as its processes do
    try:
        assert storage.run_storage.get_runs() == []
    finally:
        for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
            part.dispose()
    with psycopg.connect(db_url) as owner:
        made = owner.execute(
            sql.SQL("SELECT count(*) FROM pg_tables WHERE schemaname = 'dagster' AND tableowner = {}").format(
                sql.Literal(login)
            )
        ).fetchone()
        assert made is not None and made[0] >= 5, "Dagster's run, event and schedule tables, made by the login"
        owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(login)))  # before the fixture drops it
        owner.commit()
