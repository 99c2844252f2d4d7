"""Wings: products built on the engine (the order product, the examples), plugged in without the engine
naming them.

A wing is one ``Wing`` value registered under a part name (entry points ``outbox_pipelines.parts``); a project's
declaration turns it on. The engine knows what a wing brings, never which wing it is; a wing module imports only
the engine's values. How: docs/explanation/orders.md, "Wings and parts".
"""

import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from outbox_pipelines.core.errors import ConfigError

if TYPE_CHECKING:
    import psycopg

    from outbox_pipelines.core.retry import RetryPolicy
    from outbox_pipelines.core.storage.roles import Grant, RoleSpec

# One batch of a wing's expired shared rows deleted on the cleaner's connection: (conn, limit, now) -> rows.
SharedCleanup = Callable[["psycopg.Connection[Any]", int, datetime | None], int]


@dataclass(frozen=True)
class Wing:
    name: str
    # Destination kinds it provides: kind -> "module:factory", the factory taking (TableSettings, Settings);
    # imported only when a table uses the kind.
    destinations: Mapping[str, str] = field(default_factory=dict)
    # Destination kinds among those that take a ``url`` (its credential checked at start-up, as HTTP's).
    url_destinations: tuple[str, ...] = ()
    # Shipped tables: table name -> its settings section (a config file's section overrides it).
    shipped_tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Retry presets by name, and for some of them the GlobalSettings field whose variable sets max_attempts.
    retry_presets: Mapping[str, "RetryPolicy"] = field(default_factory=dict)
    preset_attempts_from: Mapping[str, str] = field(default_factory=dict)
    # Tables of the schema that are the wing's (created by sql/migrations): name -> what it holds.
    shared_tables: Mapping[str, str] = field(default_factory=dict)
    # Database roles of its own, the rights each engine role needs on its tables (role name -> grants),
    # and outbox tables the producer role may not write (the wing writes them itself).
    roles: tuple["RoleSpec", ...] = ()
    engine_role_grants: Mapping[str, tuple["Grant", ...]] = field(default_factory=dict)
    producer_excluded_tables: tuple[str, ...] = ()
    # The cleaner's work on its shared tables: label (its table) -> one batch of deletions.
    shared_cleanups: Mapping[str, SharedCleanup] = field(default_factory=dict)
    # Its migrations: a folder under sql/ ("parts/orders"), applied after the engine's by ``db upgrade`` and
    # recorded as "<name>/<version>".
    migrations: str = ""


# The entry-point group where an installed package registers its parts: name = "module:attribute".
PARTS_GROUP = "outbox_pipelines.parts"


_declared: list[str] = []
_loaded: dict[str, Wing] = {}


@functools.cache
def installed_parts() -> dict[str, str]:
    """The parts installed packages register (entry points of ``outbox_pipelines.parts``): name -> spec."""
    return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=PARTS_GROUP)}


def check_parts(parts: Iterable[str], where: str = "") -> tuple[str, ...]:
    """``parts`` as given, each a known part name or a "module:attribute"; ConfigError naming the installed ones."""
    names = tuple(dict.fromkeys(parts))
    for name in names:  # the installed parts are read only for a name (a scan of every package's entry points)
        if not isinstance(name, str) or (":" not in name and name not in installed_parts()):
            known = ", ".join(sorted(installed_parts())) or "none"
            raise ConfigError(
                f"{where}unknown part {name!r} in parts; the installed parts are: {known} "
                f'(or give a "module:attribute" naming a Wing)'
            )
    return names


def declare(*parts: str) -> None:
    """Use these parts in this process (names of installed parts, or "module:attribute"); loaded on first use."""
    for part in check_parts(parts):
        if part not in _declared:
            _declared.append(part)


def declared() -> tuple[str, ...]:
    return tuple(_declared)


def wings(parts: Iterable[str] | None = None) -> tuple[Wing, ...]:
    """The wings of ``parts`` (None: every part this process declared), each loaded once."""
    return tuple(_wing(part) for part in (_declared if parts is None else parts))


def _wing(part: str) -> Wing:
    if part not in _loaded:
        _loaded[part] = _load(part if ":" in part else installed_parts().get(part, part))
    return _loaded[part]


def _load(spec: str) -> Wing:
    module_name, _, attribute = spec.partition(":")
    try:
        wing = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot load the part {spec!r}: {exc}") from None
    if not isinstance(wing, Wing):
        raise ConfigError(f"the part {spec!r} is a {type(wing).__name__}, not a Wing")
    return wing


def destinations() -> dict[str, str]:
    return {kind: factory for wing in wings() for kind, factory in wing.destinations.items()}


def url_destinations() -> tuple[str, ...]:
    return tuple(kind for wing in wings() for kind in wing.url_destinations)


def shipped_tables(parts: Iterable[str] | None = None) -> dict[str, Mapping[str, Any]]:
    return {name: section for wing in wings(parts) for name, section in wing.shipped_tables.items()}


def migration_folders(parts: Iterable[str]) -> dict[str, str]:
    """Each of ``parts``' wings with migrations: its name -> its folder under sql/."""
    return {wing.name: wing.migrations for wing in wings(parts) if wing.migrations}


def retry_presets() -> dict[str, "RetryPolicy"]:
    return {name: policy for wing in wings() for name, policy in wing.retry_presets.items()}


def preset_attempts_from() -> dict[str, str]:
    return {name: env_field for wing in wings() for name, env_field in wing.preset_attempts_from.items()}


def shared_tables() -> dict[str, str]:
    return {name: what for wing in wings() for name, what in wing.shared_tables.items()}


def roles() -> tuple["RoleSpec", ...]:
    return tuple(spec for wing in wings() for spec in wing.roles)


def engine_role_grants(role: str) -> tuple["Grant", ...]:
    return tuple(grant for wing in wings() for grant in wing.engine_role_grants.get(role, ()))


def producer_excluded_tables() -> tuple[str, ...]:
    return tuple(name for wing in wings() for name in wing.producer_excluded_tables)


def shared_cleanups() -> dict[str, SharedCleanup]:
    return {label: cleanup for wing in wings() for label, cleanup in wing.shared_cleanups.items()}
