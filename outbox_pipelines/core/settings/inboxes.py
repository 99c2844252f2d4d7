"""A project's inbox tables, as declared: ``[inboxes.NAME]`` in outbox.toml, each with its dedup ``window`` (how
long a message id is remembered; the cleaner deletes entries older than that). docs/how-to/inbox.md."""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox_pipelines.core.errors import ConfigError, InvalidTableName
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.settings.values import parse_duration

# How long an inbox remembers a message id unless its section says: a redelivery later than this is handled again.
DEFAULT_WINDOW_S = 7 * 86400.0
INBOX_KEYS = ("window", "cleaner_enabled")


@dataclass(frozen=True)
class InboxSettings:
    name: str
    window_s: float = DEFAULT_WINDOW_S
    cleaner_enabled: bool = True


def inbox_settings(
    sections: Mapping[str, Any], source: Path | None, outbox_tables: Mapping[str, Any], cleaner_enabled: bool = True
) -> dict[str, InboxSettings]:
    """Each ``[inboxes.NAME]`` section read; ConfigError naming the file and the inbox for the first one wrong.
    ``cleaner_enabled``: the default of the key (OUTBOX_CLEANER_ENABLED), as for the outbox tables."""
    where = f"{source}: " if source else ""
    if not isinstance(sections, Mapping) or not all(isinstance(keys, Mapping) for keys in sections.values()):
        raise ConfigError(f"{where}inboxes must be a table of tables: one [inboxes.NAME] section per inbox")
    inboxes = {}
    for name, keys in sections.items():
        what = f"{where}[inboxes.{name}]"
        try:
            validate_table_name(name)
        except InvalidTableName as exc:
            raise ConfigError(f"{what}: {str(exc).replace('outbox table', 'inbox table')}") from None
        if name in outbox_tables:
            raise ConfigError(f"{what}: {name!r} is declared as an outbox table too ([tables.{name}]); name one other")
        unknown = sorted(set(keys) - set(INBOX_KEYS))
        if unknown:
            raise ConfigError(f"{what}: unknown keys {unknown}; an inbox takes {', '.join(INBOX_KEYS)}")
        cleaner = keys.get("cleaner_enabled", cleaner_enabled)
        if not isinstance(cleaner, bool):
            raise ConfigError(f"{what}: cleaner_enabled must be true or false, got {cleaner!r}")
        window = parse_duration(keys.get("window", DEFAULT_WINDOW_S), f"{what} window")
        if window <= 0:
            raise ConfigError(f'{what} window must be more than 0, like "7d"')
        inboxes[name] = InboxSettings(name, window, cleaner)
    return inboxes
