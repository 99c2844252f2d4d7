"""The migration files themselves: a folder's ``NNNN_name.sql`` in order, each with its checksum. Apart from
migrate.py so that the relay's schema check (schema_version.py) reads them without the upgrade's machinery.
"""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.storage.queries import sql_dir


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path | None = None, *, part: str = "") -> list[Migration]:
    """The migrations in ``directory`` (the engine's by default) in order; a part's versions are "<part>/NNNN"."""
    directory = directory or sql_dir() / "migrations"
    found = []
    for path in sorted(directory.glob("*.sql")):
        version, _, rest = path.stem.partition("_")
        if not version.isdigit():
            raise MigrationError(f"migration file {path.name} must start with a number, like 0003_add_x.sql")
        prefix = f"{part}/" if part else ""
        found.append(Migration(prefix + version, prefix + path.name, path, path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migration files share a version number in {directory}")
    return found
