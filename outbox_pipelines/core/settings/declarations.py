"""Where a project declares its outbox tables, and that declaration read: one model, two spellings.

``outbox.toml``'s ``[tables.NAME]`` and ``parts``, or an ``OutboxComponent``'s ``tables`` and ``parts`` in a
Dagster project's ``defs.yaml``; both found from the project's root, so every process reads the same tables.
More: docs/explanation/front-ends.md, "Dagster".
"""

import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings.values import did_you_mean

CONFIG_ENV = "OUTBOX_CONFIG"
COMPONENT_TYPE = "outbox_pipelines.OutboxComponent"
TOP_LEVEL_KEYS = ("tables", "parts", "shipped_tables", "embedded", "inboxes")
# The keys of a component's document in defs.yaml (dg's): the table settings are under attributes.
COMPONENT_DOCUMENT_KEYS = ("type", "attributes", "template_vars_module", "requirements", "post_processing")
# Directories of a defs folder a search for a component's defs.yaml never enters.
_SKIPPED_DIRS = {"__pycache__", "node_modules"}
# The one template a declaration's values take (as dg resolves it): {{ env.NAME }}, empty when unset.
_ENV_TEMPLATE = re.compile(r"\{\{\s*env\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


@dataclass(frozen=True)
class Declaration:
    """A project's tables' sections, the parts whose tables come with them, and where it was read."""

    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    source: Path | None = None
    # Where each table is declared when that is not ``source`` (several OutboxComponents in one project).
    table_sources: Mapping[str, Path] = field(default_factory=dict)
    # The inbox tables' sections (``[inboxes.NAME]``, core/settings/inboxes.py reads them).
    inboxes: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: Path | None) -> "Declaration":
        """A declaration from a file's (or a component's) top level: ``tables`` and ``parts``."""
        where = f"{source}: " if source else ""
        unknown_top = set(data) - set(TOP_LEVEL_KEYS)
        if unknown_top:
            yaml = source is not None and source.suffix in (".yaml", ".yml")
            raise ConfigError(
                f"{where}unknown {'keys under attributes' if yaml else 'top-level keys'} {sorted(unknown_top)}"
                f"{did_you_mean(unknown_top, TOP_LEVEL_KEYS)}; put table settings under "
                f"{'attributes: tables: NAME:' if yaml else '[tables.NAME]'} (the keys are {', '.join(TOP_LEVEL_KEYS)})"
            )
        if not isinstance(data.get("embedded", False), bool):
            raise ConfigError(f"{where}embedded must be true or false, got {data['embedded']!r}")
        tables = data.get("tables") or {}
        if not isinstance(tables, Mapping) or not all(isinstance(s, Mapping) for s in tables.values()):
            raise ConfigError(f"{where}tables must be a table of tables: one [tables.NAME] section per table")
        tables_read = {name: dict(section) for name, section in tables.items()}
        return cls(tables_read, _parts(data, where), source, inboxes=data.get("inboxes") or {})


def _parts(data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The parts a declaration opts into: ``parts``, or every installed one for ``shipped_tables = true``."""
    from outbox_pipelines.core import wings

    shipped = data.get("shipped_tables", False)
    if not isinstance(shipped, bool):
        raise ConfigError(f"{where}shipped_tables must be true or false, got {shipped!r}")
    parts = data.get("parts") or []
    if not isinstance(parts, list) or not all(isinstance(part, str) for part in parts):
        raise ConfigError(f'{where}parts must be a list of part names, like parts = ["orders"]; got {parts!r}')
    if shipped:
        parts = [*parts, *sorted(wings.installed_parts())]
    return wings.check_parts(parts, where)


def load_config_file(path: Path | None) -> Declaration:
    """outbox.toml's declaration (no file: no table)."""
    if path is None:
        return Declaration()
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:  # unreadable, or not text: a file the settings cannot be
        raise ConfigError(
            f"{path}: cannot be read as a settings file: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    return Declaration.from_mapping(data, path)


def find_declaration(env: Mapping[str, str] | None = None, start: Path | None = None) -> Declaration:
    """OUTBOX_CONFIG's file, else the project's outbox.toml, else its OutboxComponent's defs.yaml, else none."""
    env = os.environ if env is None else env
    explicit = env.get(CONFIG_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_ENV}={explicit} does not name a file")
        return load_config_file(path)
    from outbox_pipelines.core.storage.db import project_root

    root = project_root(start)
    components = list(component_files(root))
    toml = root / "outbox.toml"
    if toml.is_file():
        declared = load_config_file(toml)
        if declared.tables or declared.parts or not components:
            refuse_two_declarations(root, components)
            return declared
    return load_components(components, env)


def refuse_two_declarations(root: Path, components: list[Path] | None = None) -> None:
    """ConfigError when the project at ``root`` declares tables (or parts) in its outbox.toml and has an
    OutboxComponent too: the CLI and Dagster would each read one of them and relay different tables. The
    outbox.toml of settings only (``embedded = true``) goes with components."""
    components = list(component_files(root)) if components is None else components
    toml = root / "outbox.toml"
    if not components or not toml.is_file():
        return
    declared = load_config_file(toml)
    if declared.tables or declared.parts:
        raise ConfigError(
            f"{toml} declares {'tables' if declared.tables else 'parts'} and {components[0]} declares an "
            "OutboxComponent: the command line and Dagster would each read one. Declare the project's tables in "
            "one place: move outbox.toml's [tables.NAME] sections (and parts) into the component's defs.yaml, "
            "or remove the component"
        )


def load_components(paths: list[Path], env: Mapping[str, str]) -> Declaration:
    """The project's OutboxComponents as one declaration (several teams' tables in one project): every table of
    each, and every part any names. A table declared in two of them is refused, naming both files."""
    if len(paths) <= 1:
        return load_component_file(paths[0], env) if paths else Declaration()
    tables: dict[str, Mapping[str, Any]] = {}
    sources: dict[str, Path] = {}
    parts: list[str] = []
    inboxes: dict[str, Any] = {}
    for path in paths:
        declaration = load_component_file(path, env)
        for name, section in declaration.tables.items():
            if name in tables:
                raise ConfigError(
                    f"{path}: table {name!r} is declared in {sources[name]} too; declare each table in one "
                    "OutboxComponent"
                )
            tables[name], sources[name] = section, path
        parts += declaration.parts
        inboxes.update(declaration.inboxes)
    return Declaration(tables, tuple(dict.fromkeys(parts)), paths[0], sources, inboxes)


def component_files(root: Path) -> Iterator[Path]:
    """The defs.yaml files declaring an OutboxComponent in the project's defs folder (the Dagster project's
    ``[tool.dg.project]`` in pyproject.toml: ``defs_module``, else ``<root_module>.defs``; none without it)."""
    defs = _defs_folder(root)
    if defs is None:
        return
    for directory, subdirectories, files in os.walk(defs):
        subdirectories[:] = sorted(d for d in subdirectories if not d.startswith(".") and d not in _SKIPPED_DIRS)
        if "defs.yaml" in files:
            path = Path(directory) / "defs.yaml"
            if COMPONENT_TYPE in path.read_text(errors="replace"):
                yield path


def _defs_folder(root: Path) -> Path | None:
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("dg", {}).get("project")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    if not isinstance(project, dict) or not isinstance(project.get("root_module"), str):
        return None
    module = project.get("defs_module") or f"{project['root_module']}.defs"
    relative = Path(*str(module).split("."))
    return next((folder for folder in (root / relative, root / "src" / relative) if folder.is_dir()), None)


def read_component_yaml(path: Path) -> list[Mapping[str, Any]]:
    """The YAML documents of a defs.yaml, or ConfigError: not YAML, or a key given twice in one mapping (YAML
    keeps the last one silently: a table declared twice would go where its second section says, as TOML
    refuses). The CLI reads the component's file with it, and so does the component itself before Dagster's
    own reading is used."""
    import yaml  # Dagster's dependency, read only when a project declares its tables in defs.yaml

    class UniqueKeys(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(
                        f"{path}, line {key_node.start_mark.line + 1}: {key!r} is given twice in the same mapping "
                        "(a table declared twice?); keep one"
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    try:
        return [d for d in yaml.load_all(path.read_text(), Loader=UniqueKeys) if isinstance(d, Mapping)]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def load_component_file(path: Path, env: Mapping[str, str]) -> Declaration:
    """The OutboxComponent's attributes in ``path`` (a defs.yaml may hold several documents), with its
    ``{{ env.NAME }}`` values resolved as dg resolves them."""
    documents = read_component_yaml(path)
    ours = [d for d in documents if d.get("type") == COMPONENT_TYPE]
    if not ours:
        raise ConfigError(f"{path}: no document of type {COMPONENT_TYPE}")
    unknown = set(ours[0]) - set(COMPONENT_DOCUMENT_KEYS)
    if unknown:  # dg's own reading refuses them too; said here for the CLI, which reads the file itself
        raise ConfigError(
            f"{path}: unknown keys {sorted(map(str, unknown))}{did_you_mean(unknown, COMPONENT_DOCUMENT_KEYS)} in "
            f"the {COMPONENT_TYPE} document; the tables go under attributes: tables:"
        )
    attributes = _resolve_env(_url_templates_as_url_env(ours[0].get("attributes") or {}), env)
    if not isinstance(attributes, Mapping):
        raise ConfigError(f"{path}: attributes must be a mapping (tables: ...)")
    return Declaration.from_mapping(attributes, path)


def _url_templates_as_url_env(attributes: Any) -> Any:
    """A table's ``url: "{{ env.NAME }}"`` read as ``url_env: NAME``: the URL comes from the deployment's
    environment, so a credential in it is no credential written in the file, and an unset NAME is told by name."""
    tables = attributes.get("tables") if isinstance(attributes, Mapping) else None
    if not isinstance(tables, Mapping):
        return attributes
    converted = {}
    for name, section in tables.items():
        url = section.get("url") if isinstance(section, Mapping) else None
        whole = _ENV_TEMPLATE.fullmatch(url.strip()) if isinstance(url, str) else None
        if whole and isinstance(section, Mapping) and "url_env" not in section:
            section = {**{k: v for k, v in section.items() if k != "url"}, "url_env": whole.group(1)}
        converted[name] = section
    return {**attributes, "tables": converted}


def _resolve_env(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        whole = _ENV_TEMPLATE.fullmatch(value.strip())
        if whole:
            return env.get(whole.group(1)) or None
        return _ENV_TEMPLATE.sub(lambda m: env.get(m.group(1), ""), value)
    if isinstance(value, Mapping):
        return {key: _resolve_env(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve_env(item, env) for item in value]
    return value
