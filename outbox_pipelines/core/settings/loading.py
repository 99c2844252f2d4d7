"""The settings a process runs with: the environment and every table's section, loaded together
(``load_settings``), with each table whose section cannot be used set aside and named (``Settings.broken``).
"""

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import ConfigError, MissingSecret, UnknownTable
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.settings.declarations import Declaration, find_declaration, load_config_file
from outbox_pipelines.core.settings.environment import GlobalSettings
from outbox_pipelines.core.settings.inboxes import InboxSettings, inbox_settings
from outbox_pipelines.core.settings.sections import build_table_settings, check_section
from outbox_pipelines.core.settings.tables import DEFAULT_GROUP, TableSettings, shipped_tables
from outbox_pipelines.core.storage.project_dir import project_name


@dataclass(frozen=True)
class Settings:
    env: GlobalSettings
    tables: dict[str, TableSettings]
    source: Path | None
    # Tables whose section cannot be used, with what is wrong (ConfigError's message): the others load and
    # relay without them; every command or check that names one says why.
    broken: dict[str, str] = field(default_factory=dict)
    # The relay group a broken table's section names (None: its group cannot be read either), so that a group's
    # relay tells its own broken tables, not another group's.
    broken_groups: dict[str, str | None] = field(default_factory=dict)
    # The declaration as a whole cannot be read (not TOML, an unknown top-level key): no table is known. Set
    # only by ``load_settings_or_problem``, for the processes that must stay up to say so (Dagster's).
    problem: str | None = None
    # The opt-in parts the declaration names (core/wings.py): their tables are among ``tables``.
    parts: tuple[str, ...] = ()
    # The project whose tables these are (core/storage/project_dir.py: project_name): a table another project
    # owns is not its to relay (core/settings/owners.py).
    project: str = ""
    # The inbox tables the project declares ([inboxes.NAME]), by name: db upgrade creates them, the cleaner empties
    # them past their window.
    inboxes: dict[str, InboxSettings] = field(default_factory=dict)
    # Those of ``broken`` whose only fault is a credential variable not set in this process, read without it: what
    # status, replay, requeue-stuck and clean need of them (``for_operations``); no relay is built from them.
    without_secrets: dict[str, TableSettings] = field(default_factory=dict)

    def table(self, name: str) -> TableSettings:
        if name in self.broken:
            raise ConfigError(self.broken[name])
        validate_table_name(name)
        try:
            return self.tables[name]
        except KeyError:
            known = f"known tables: {', '.join(sorted(self.tables))}" if self.tables else "no table is declared"
            if name in self.inboxes:  # an inbox is not relayed: it is the receiving side's (docs/how-to/inbox.md)
                raise UnknownTable(f"{name!r} is an inbox ([inboxes.{name}]), not an outbox table; {known}") from None
            raise UnknownTable(
                f"no settings for table {name!r}; {known}. "
                f"Add a [tables.{name}] section to {self.source or 'outbox.toml (OUTBOX_CONFIG)'}"
            ) from None

    def for_operations(self, name: str) -> TableSettings:
        """The table, for a command that reads or maintains it and never delivers: one whose credential variable
        is not set in this process is given too (``without_secrets``); otherwise as ``table``."""
        if name in self.without_secrets:
            return self.without_secrets[name]
        return self.table(name)

    @property
    def broken_for_operations(self) -> dict[str, str]:
        """``broken`` without the tables ``for_operations`` gives anyway."""
        return {name: why for name, why in self.broken.items() if name not in self.without_secrets}

    def check(self) -> None:
        """ConfigError listing every table whose section cannot be used (the strict reading of the file)."""
        if self.problem:
            raise ConfigError(self.problem)
        if self.broken:
            raise ConfigError("; ".join(self.broken[name] for name in sorted(self.broken)))

    def broken_in_group(self, group: str) -> dict[str, str]:
        """The broken tables whose section names ``group`` (or whose group cannot be read), with what is wrong."""
        return {name: why for name, why in self.broken.items() if self.broken_groups.get(name, group) in (group, None)}

    def groups(self) -> dict[str, list[str]]:
        """Each relay group's tables (the usable ones), by name."""
        groups: dict[str, list[str]] = {}
        for name in sorted(self.tables):
            groups.setdefault(self.tables[name].group, []).append(name)
        return groups


def load_settings(
    env: Mapping[str, str] | None = None, path: Path | None = None, declaration: Declaration | None = None
) -> Settings:
    """The settings; a table whose section cannot be used is left out and named in ``broken`` (its error), so
    one table's mistake never takes the others down. A file that is not valid TOML still raises ConfigError.

    The tables are ``declaration``'s (an ``OutboxComponent``'s), else the file's at ``path``, else
    OUTBOX_CONFIG's or the project's ``outbox.toml``; with the tables of the parts it declares."""
    global_settings = GlobalSettings.from_env(env)
    # A declaration handed in is a Dagster code location's (its OutboxComponent's defs.yaml): its project is the one
    # holding that file, wherever the process runs (a workspace's run worker starts in the workspace's directory).
    # One found here is the working directory's project's.
    project_start = declaration.source.parent if declaration is not None and declaration.source else None
    if declaration is None:
        declaration = load_config_file(path) if path is not None else find_declaration(env)
    source = declaration.source
    wings.declare(*declaration.parts)  # their destinations, presets and shared tables, for this process
    sections: dict[str, dict[str, Any]] = shipped_tables(declaration.parts)
    written = declaration.tables
    for name, section in written.items():
        sections[name] = {**sections.get(name, {}), **section}
    tables: dict[str, TableSettings] = {}
    broken: dict[str, str] = {}
    broken_groups: dict[str, str | None] = {}
    without_secrets: dict[str, TableSettings] = {}
    for name, section in sections.items():
        where = declaration.table_sources.get(name, source)
        try:
            if name in written:
                check_section(name, written[name], where)
            tables[name] = build_table_settings(name, section, global_settings)
        except ConfigError as exc:
            text = str(exc)
            broken[name] = text if where is None or text.startswith(str(where)) else f"{where}: {text}"
            group = section.get("group", DEFAULT_GROUP)
            broken_groups[name] = group if isinstance(group, str) else None
            if isinstance(exc, MissingSecret):
                with contextlib.suppress(ConfigError):  # a mistake past the credential: broken for every command
                    without_secrets[name] = build_table_settings(name, section, global_settings, without_secrets=True)
    inboxes = inbox_settings(declaration.inboxes, source, sections, global_settings.cleaner_enabled)
    return Settings(
        global_settings,
        tables,
        source,
        broken,
        broken_groups,
        parts=declaration.parts,
        project=project_name(project_start),
        inboxes=inboxes,
        without_secrets=without_secrets,
    )


def load_settings_or_problem(
    env: Mapping[str, str] | None = None, path: Path | None = None, declaration: Declaration | None = None
) -> Settings:
    """``load_settings`` for a process that must stay up when the declaration cannot be read at all (Dagster's
    code location, its sensors): no table, and ``problem`` saying what to fix, for a check and an alert to tell,
    instead of a code location that fails to load and goes quiet."""
    try:
        return load_settings(env, path, declaration)
    except ConfigError as exc:
        return Settings(GlobalSettings.from_env(env), {}, path, problem=str(exc))
