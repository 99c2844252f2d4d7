"""The registry as the reference's Markdown tables: one of the table keys, one of the environment variables.

Each renderer takes the entries to show (the engine's by default), so a layer with variables of its own can
render its table the same way.
"""

from collections.abc import Iterable

from outbox_pipelines.core.settings.registry.table_keys import TABLE_KEY_REGISTRY, TableKey
from outbox_pipelines.core.settings.registry.variables import ENVIRONMENT, EnvVariable


def _cell(text: str) -> str:
    # A "|" inside a cell would end it.
    return text.replace("|", "\\|")


def _row(*cells: str) -> str:
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _kind(key: TableKey) -> str:
    if key.kind == "choice":
        return "one of " + ", ".join(f"`{word}`" for word in key.choices)
    return key.kind


def _key_default(key: TableKey) -> str:
    if key.default is None:
        return key.default_note or "none"
    text = f"`{key.default}`"
    if key.default_from:
        text = f"`{key.default_from}`, else {text}"
    return f"{text} ({key.default_note})" if key.default_note else text


def _variable_default(variable: EnvVariable) -> str:
    if variable.default is None:
        return variable.default_note or "unset"
    text = f"`{variable.default}`"
    return f"{text} ({variable.default_note})" if variable.default_note else text


def render_table_keys_markdown(keys: Iterable[TableKey] = TABLE_KEY_REGISTRY) -> str:
    """The table keys' reference: key, kind, default, the destinations that read it, meaning."""
    lines = [_row("key", "kind", "default", "destinations", "meaning"), "|---|---|---|---|---|"]
    for key in keys:
        destinations = ", ".join(f"`{kind}`" for kind in key.applies_to) or "all"
        lines.append(_row(f"`{key.name}`", _kind(key), _key_default(key), destinations, key.meaning))
    return "\n".join(lines) + "\n"


def render_environment_markdown(variables: Iterable[EnvVariable] = ENVIRONMENT) -> str:
    """The environment variables' reference: variable, default, meaning, where it is read."""
    lines = [_row("variable", "default", "meaning", "read by"), "|---|---|---|---|"]
    for variable in variables:
        lines.append(
            _row(
                f"`{variable.name}`",
                _variable_default(variable),
                variable.meaning,
                f"`outbox_pipelines/{variable.read_by}`",
            )
        )
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """Both tables, each under a heading."""
    return (
        f"## Table keys\n\n{render_table_keys_markdown()}\n## Environment variables\n\n{render_environment_markdown()}"
    )
