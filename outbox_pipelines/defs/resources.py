"""Resources: the outbox database and the destinations of each table."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.destinations.wiring import build_destination
from outbox_pipelines.core.oncall.health import CheckVerdict, TableStatus, read_status, ready_count
from outbox_pipelines.core.oncall.sweep import SweepReport, relays_died_with_run, sweep, table_verdicts
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings_or_problem
from outbox_pipelines.core.settings.declarations import Declaration
from outbox_pipelines.core.storage import db
from outbox_pipelines.core.storage.db import driver_connection
from outbox_pipelines.core.storage.network_limits import params
from outbox_pipelines.core.storage.table import OutboxTable, SharedTables, ready_tables
from outbox_pipelines.defs.links import DagsterLinks

TABLE_TAG = "outbox/table"


class OutboxDatabase:
    """The outbox's PostgreSQL: ``url``, else OUTBOX_DATABASE_URL, else the embedded server; the table
    settings from ``declaration`` (an ``OutboxComponent``'s tables), else ``config_path``, else
    OUTBOX_CONFIG / the project's outbox.toml.

    Where the outbox lives, which settings (and so which destinations and credentials) apply, is the
    deployment's decision, made in code (``outbox_resources(url=..., config_path=...)`` in a
    ``Definitions``) or in the environment. It has no run config: a launch from the Dagster UI, which has
    no login, cannot point a run at another database or another settings file.

    ``engine()`` is a pooled SQLAlchemy engine on psycopg 3 for short reads
    (checks, sensors). Relays open their own dedicated connections because they
    hold a session advisory lock and LISTEN, which must not go back to a pool.
    """

    def __init__(
        self, url: str | None = None, config_path: str | None = None, declaration: Declaration | None = None
    ) -> None:
        self.url = url
        self.config_path = config_path
        self.declaration = declaration
        self._resolved: str | None = None
        self._engine: sa.Engine | None = None

    def database_url(self) -> str:
        if self._resolved is None:
            self._resolved = db.psycopg_url(self.url) if self.url else db.resolve_database(announce=False).url
        return self._resolved

    def engine(self) -> sa.Engine:
        if self._engine is None:
            url = self.database_url()
            self._engine = sa.create_engine(  # a connect timeout and keepalives: a check never hangs on the network
                db.sqlalchemy_url(url), pool_size=2, max_overflow=4, pool_pre_ping=True, connect_args=params(url)
            )
        return self._engine

    def table_verdicts(self, table_name: str) -> list[CheckVerdict]:
        """The table's checks (core.oncall.table_verdicts), read over a pooled connection."""
        with self.engine().connect() as conn:
            return table_verdicts(driver_connection(conn), self.settings(), table_name)

    def table_status(self, table: TableSettings) -> TableStatus:
        """Counts, lag and dead letters of one table, read over a pooled connection."""
        with self.engine().connect() as conn:
            return read_status(OutboxTable(driver_connection(conn), table.name), stuck_after_s=table.stuck_threshold_s)

    def ready_count(self, table: TableSettings) -> int:
        with self.engine().connect() as conn:
            return ready_count(driver_connection(conn), table.name, table.paused_topics)

    def ready_tables(self, table_names: list[str]) -> set[str]:
        """Which of these tables have messages ready now (one statement; a table that does not exist yet is
        left out: its relay group reports it)."""
        settings = self.settings()
        with self.engine().connect() as conn:
            raw = driver_connection(conn)
            existing = set(SharedTables(raw).outbox_table_names())
            return ready_tables(
                raw,
                {
                    name: settings.tables[name].paused_topics
                    for name in table_names
                    if name in existing and name in settings.tables
                },
            )

    def sweep(self) -> SweepReport:
        """The on-call sweep over every configured table (core.oncall.sweep)."""
        return sweep(self.database_url(), self.settings(), links=DagsterLinks())

    def relays_died_with_run(self, run_id: str) -> list[dict[str, Any]]:
        """Bury the relays of a failed run that never said goodbye; the alerts told (core.oncall)."""
        return relays_died_with_run(self.database_url(), self.settings(), run_id, links=DagsterLinks())

    def settings(self) -> Settings:
        return load_settings_or_problem(
            path=Path(self.config_path) if self.config_path else None, declaration=self.declaration
        )

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None


class OutboxDestinations:
    """Builds each table's destination from its settings (HTTP, handlers, the order broker, paper): where
    messages go and with which credential is the settings' (the deployment's), never a launch's."""

    def for_table(self, table: TableSettings, settings: Settings) -> Destination:
        return build_destination(table, settings)


# What ops, sensors and checks declare: the objects above, handed over as they are (no config schema).
OutboxDb = dg.ResourceParam[OutboxDatabase]
Destinations = dg.ResourceParam[OutboxDestinations]


def outbox_resources(
    url: str | None = None, config_path: str | None = None, declaration: Declaration | None = None
) -> dict[str, dg.ResourceDefinition]:
    """The resources of the outbox's definitions: ``outbox_db`` and ``outbox_destinations``.

    Each has an empty config schema, so a run config that tries to set anything on them is refused
    ("unexpected config entry") instead of redirecting messages or credentials.
    """

    @dg.resource(
        config_schema={},
        description="The outbox's PostgreSQL and table settings (set by the "
        "deployment: OUTBOX_DATABASE_URL, OUTBOX_CONFIG; not configurable at launch).",
    )
    def outbox_db(_: dg.InitResourceContext) -> Iterator[OutboxDatabase]:
        database = OutboxDatabase(url=url, config_path=config_path, declaration=declaration)
        try:
            yield database
        finally:
            database.close()

    @dg.resource(
        config_schema={}, description="Each table's destination, from its settings (not configurable at launch)."
    )
    def outbox_destinations(_: dg.InitResourceContext) -> OutboxDestinations:
        return OutboxDestinations()

    return {"outbox_db": outbox_db, "outbox_destinations": outbox_destinations}
