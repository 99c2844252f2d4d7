"""The PostgreSQL the tests run against: OUTBOX_TEST_DATABASE_URL, or an embedded server.

One server per session; a template database with the migrations applied; a
fresh database per test cloned from the template (pgqueuer's approach).
"""

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

from outbox_pipelines.core import db, migrate

TEST_URL_ENV = "OUTBOX_TEST_DATABASE_URL"


class TestServer:
    def __init__(self) -> None:
        self._tmp: Path | None = None
        external = os.environ.get(TEST_URL_ENV)
        if external:
            self.admin_url = db.psycopg_url(external)
        else:
            self._tmp = Path(tempfile.mkdtemp(prefix="outbox-test-pg-"))
            self.admin_url = db.start_embedded(self._tmp, database="postgres")
        self.prefix = f"outbox_t{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self._counter = itertools.count(1)
        self._create_template()

    def url_for(self, database: str) -> str:
        return db.url_with_database(self.admin_url, database)

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _create_template(self) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.template)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate.upgrade(self.url_for(self.template))

    def create_database(self) -> tuple[str, str]:
        name = f"{self.prefix}_{next(self._counter)}"
        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(self.template))
            )
        return name, self.url_for(name)

    def drop_database(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        try:
            with self._admin() as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.template)))
        except psycopg.Error:
            pass
        if self._tmp is not None:
            db.stop_embedded(self._tmp)
            shutil.rmtree(self._tmp, ignore_errors=True)
