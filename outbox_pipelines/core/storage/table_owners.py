"""Which project owns each outbox table (``outbox_table_owners``, migration 0013).

A table's owner is the project that first declared it to ``db upgrade`` or ``db create-table``; a relay of any
other project leaves it alone (core/settings/owners.py), and ``db hand-over`` is the one way to change it. A
table no project has claimed (one made before 0013, or by a test's template) is anyone's to relay.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import dict_row

from outbox_pipelines.core.storage.queries import shared_query


@dataclass(frozen=True)
class Owner:
    table: str
    project: str
    declared_at: datetime
    previous: str | None = None
    changed_at: datetime | None = None

    def refusal(self, project: str) -> str:
        """What a project that is not the owner is told about the table."""
        return (
            f"outbox table {self.table} belongs to the project {self.project!r} (declared "
            f"{self.declared_at:%Y-%m-%d %H:%M} UTC), not to this one ({project!r}): its relay and destination "
            f"are {self.project!r}'s. Use another table name, or hand it over on purpose: "
            f"outbox-pipelines db hand-over {self.table} --from {self.project}"
        )


def _rows(conn: psycopg.Connection, name: str, params: dict[str, object]) -> list[dict[str, object]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(shared_query(name), params)
        return cur.fetchall() if cur.description else []


def _owner(row: dict[str, object]) -> Owner:
    return Owner(
        str(row["outbox_table"]),
        str(row["project"]),
        row["declared_at"],  # type: ignore[arg-type]
        row["previous"],  # type: ignore[arg-type]
        row["changed_at"],  # type: ignore[arg-type]
    )


def owners(conn: psycopg.Connection, tables: Iterable[str] | None = None) -> dict[str, Owner]:
    """The recorded owner of each of ``tables`` that has one (None: of every table)."""
    if not _rows(conn, "outbox_table_owners_exists", {})[0]["ok"]:
        return {}
    rows = (
        _rows(conn, "outbox_table_owners_all", {})
        if tables is None
        else _rows(conn, "outbox_table_owners_of", {"tables": list(tables)})
    )
    return {owner.table: owner for owner in map(_owner, rows)}


def claim(conn: psycopg.Connection, tables: Iterable[str], project: str) -> dict[str, Owner]:
    """Record ``project`` as the owner of each of ``tables`` nobody owns; the tables another project owns."""
    for table in tables:
        _rows(conn, "outbox_table_owners_claim", {"table": table, "project": project})
    return {name: owner for name, owner in owners(conn, tables).items() if owner.project != project}


def hand_over(conn: psycopg.Connection, table: str, from_project: str, to_project: str) -> bool:
    """Make ``to_project`` the owner of ``table`` if ``from_project`` owns it now; False otherwise."""
    return bool(
        _rows(conn, "outbox_table_owners_hand_over", {"table": table, "from": from_project, "project": to_project})
    )
