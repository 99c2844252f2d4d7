"""Fixtures of the engine's tests."""

import psycopg
import pytest


@pytest.fixture
def empty_db(pg_server):
    name = f"{pg_server.prefix}_empty_{id(object())}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url_for(name)
    pg_server.drop_database(name)
