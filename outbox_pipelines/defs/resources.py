"""Resources: the outbox database and the destinations of each table."""

from dataclasses import replace
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa
from pydantic import PrivateAttr

from outbox_pipelines.core import db
from outbox_pipelines.core.db import driver_connection
from outbox_pipelines.core.destinations.base import Destination
from outbox_pipelines.core.health import TableStatus, read_status, ready_count
from outbox_pipelines.core.oncall import SweepReport, relays_died_with_run, sweep
from outbox_pipelines.core.settings import Settings, TableSettings, load_settings
from outbox_pipelines.core.table import OutboxTable
from outbox_pipelines.core.wiring import build_destination

TABLE_TAG = "outbox/table"

# The resources subclass ConfigurableResource bare, as Dagster's documentation does: subscripting
# it (a pydantic model) would build a parametrized class at runtime. Hence type: ignore[type-arg].


class OutboxDatabase(dg.ConfigurableResource):  # type: ignore[type-arg]  # see above
    """The outbox's PostgreSQL: ``url``, else OUTBOX_DATABASE_URL, else the embedded server.

    ``engine()`` is a pooled SQLAlchemy engine on psycopg 3 for short reads
    (checks, sensors). Relays open their own dedicated connections because they
    hold a session advisory lock and LISTEN, which must not go back to a pool.
    """

    url: str | None = None
    config_path: str | None = None
    _resolved: str | None = PrivateAttr(default=None)
    _engine: sa.Engine | None = PrivateAttr(default=None)

    def database_url(self) -> str:
        if self._resolved is None:
            self._resolved = db.psycopg_url(self.url) if self.url else db.resolve_database(announce=False).url
        return self._resolved

    def engine(self) -> sa.Engine:
        if self._engine is None:
            self._engine = sa.create_engine(
                db.sqlalchemy_url(self.database_url()), pool_size=2, max_overflow=4, pool_pre_ping=True
            )
        return self._engine

    def table_status(self, table: TableSettings) -> TableStatus:
        """Counts, lag and dead letters of one table, read over a pooled connection."""
        with self.engine().connect() as conn:
            return read_status(OutboxTable(driver_connection(conn), table.name), stuck_after_s=table.stuck_threshold_s)

    def ready_count(self, table: TableSettings) -> int:
        with self.engine().connect() as conn:
            return ready_count(driver_connection(conn), table.name, table.paused_topics)

    def sweep(self) -> SweepReport:
        """The on-call sweep over every configured table (core.oncall.sweep)."""
        return sweep(self.database_url(), self.settings())

    def relays_died_with_run(self, run_id: str) -> list[dict[str, Any]]:
        """Bury the relays of a failed run that never said goodbye; the alerts told (core.oncall)."""
        return relays_died_with_run(self.database_url(), self.settings(), run_id)

    def settings(self) -> Settings:
        return load_settings(path=Path(self.config_path) if self.config_path else None)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()


class OutboxDestinations(dg.ConfigurableResource):  # type: ignore[type-arg]  # see above
    """Builds each table's destination from its settings (HTTP via httpx, handlers, paper broker).

    ``url_overrides`` sends a table's HTTP traffic elsewhere (a drill, a broker simulator).
    """

    url_overrides: dict[str, str] = {}

    def for_table(self, table: TableSettings, settings: Settings) -> Destination:
        override = self.url_overrides.get(table.name)
        if override:
            table = replace(table, destination="orders" if table.destination == "orders" else "http", url=override)
        return build_destination(table, settings)
