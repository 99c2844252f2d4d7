"""Throwaway PostgreSQL databases for tests and benchmarks: a server, a migrated template, fresh clones.

Migrating once and cloning the template (``CREATE DATABASE ... TEMPLATE``) gives
every test or benchmark scenario a database of its own in a few tens of
milliseconds, with no rows, dead tuples or statistics left by another (the
approach of pgqueuer's and procrastinate's test helpers). The test fixtures
(``outbox_pipelines_tests/conftest.py``) and the benchmark (``bench/obench``)
both use it. No pytest here: the benchmark is a plain script.
"""

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg import sql

from outbox_pipelines.core.storage import db, migrate


class ScratchServer:
    """The server the databases live on: an external one, or an embedded one this process started.

    ``data_dir`` is set only for an embedded server: ``stop`` then stops it and deletes its files;
    an external server is never stopped.
    """

    def __init__(self, admin_url: str, data_dir: Path | None = None) -> None:
        self.admin_url = admin_url
        self.data_dir = data_dir

    @classmethod
    def from_env(cls, url_env: str, dir_prefix: str, starting: Callable[[Path], None] | None = None) -> "ScratchServer":
        """The server named by the URL in ``url_env``, else an embedded one started under a new temporary directory.

        ``starting`` is told the directory before the embedded server starts (it takes seconds).
        """
        external = os.environ.get(url_env)
        if external:
            return cls(db.psycopg_url(external))
        data_dir = Path(tempfile.mkdtemp(prefix=dir_prefix))
        if starting is not None:
            starting(data_dir)
        return cls(db.start_embedded(data_dir, database="postgres"), data_dir)

    @property
    def embedded(self) -> bool:
        return self.data_dir is not None

    def stop(self) -> bool:
        """Stop the embedded server and delete its files; False when it was not running (or is external)."""
        if self.data_dir is None:
            return False
        # stop_embedded signals the postmaster by the pid in its pid file: only our server.
        stopped = db.stop_embedded(self.data_dir)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        return stopped


# The parts this repository's own project declares (outbox.toml at its root).
REPOSITORY_PARTS = ("orders", "examples")
# The same as a declaration's first line: a test's own outbox.toml that names the order product's or the
# examples' tables starts with it, as a project using them would.
DEMO_PARTS = f"parts = {list(REPOSITORY_PARTS)}\n".replace("'", '"')


class TemplateDatabases:
    """A migrated template database on one server, and fresh databases cloned from it.

    Every name starts with ``prefix`` (the process id in it keeps concurrent test sessions
    apart on a shared server). Creating the object creates the template, replacing a leftover
    of the same name. The template has the tables of ``parts`` (this repository's: the order product and
    the examples, which most tests use; ``()`` for an adopter's database with the engine's tables alone).
    """

    def __init__(self, admin_url: str, prefix: str, parts: tuple[str, ...] = REPOSITORY_PARTS) -> None:
        self.admin_url = admin_url
        self.prefix = prefix
        self.template = f"{prefix}_template"
        self._counter = itertools.count(1)
        self._drop(self.template)
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate.upgrade(self.url_for(self.template), parts=parts)

    def url_for(self, database: str) -> str:
        """The URL of ``database`` on this server, with the admin URL's credentials."""
        return db.url_with_database(self.admin_url, database)

    def create_database(self, label: str | None = None) -> tuple[str, str]:
        """A fresh clone of the template: its name and URL. ``label`` goes into the name."""
        middle = f"_{label}" if label else ""
        name = f"{self.prefix}{middle}_{next(self._counter)}"
        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(self.template))
            )
        return name, self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, closing its sessions first (a test may leave one open)."""
        self._drop(name)

    def drop_template(self) -> None:
        """Drop the template at the end of the session; a server already gone is not an error."""
        try:
            self._drop(self.template)
        except psycopg.Error:
            pass

    def _drop(self, name: str) -> None:
        with self._admin() as conn:
            try:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            except psycopg.errors.InsufficientPrivilege:
                # A login that is no superuser may not end an autovacuum worker with FORCE (PostgreSQL 14; .ci/run's
                # PostgreSQL lane): it ends its own sessions, and a plain DROP stops the worker itself.
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND usename = current_user AND pid <> pg_backend_pid()",
                    [name],
                )
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))

    def _admin(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True)
