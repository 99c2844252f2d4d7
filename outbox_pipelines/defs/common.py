"""Helpers shared by the ops: refused launches, core errors as clear run failures, metadata values.

An operator's mistake in a launch (no replay filter, ``since: yesterday``, a table that does not exist, no
partition) is a *refused launch*: the op raises ``RefusedLaunch`` before it changes anything, its
message names the field, what was wrong and what to write instead, and its metadata carries
``refused_input`` so that ``outbox_run_failure_alert`` tells it from a real failure (defs/alerts.py).
"""

import difflib
import re
from collections.abc import Sequence
from enum import Enum
from typing import Any

import dagster as dg
from pydantic import ValidationError

from outbox_pipelines.core.errors import ConfigError, InvalidTableName, UnknownTable
from outbox_pipelines.core.settings import Settings, TableSettings
from outbox_pipelines.core.settings.values import free_text

# Maintenance and the checks job go ahead of relay runs in Dagster's run queue (and dagster.yaml keeps slots that
# relay runs cannot take): with 50 tables relaying, requeue-stuck, clean and the checks still start on time.
MAINTENANCE_TAGS = {"dagster/priority": "10"}


def table_asset_key(table_name: str) -> dg.AssetKey:
    return dg.AssetKey(["outbox", table_name])


# The Failure metadata key that marks a refused launch; its value is the field the operator got wrong.
REFUSED_INPUT = "refused_input"
REFUSED_NOTE = "nothing was changed; correct the field and launch again"


def named(field: str, message: str) -> str:
    """``message`` led by the field it is about, unless it names the field already before its first colon."""
    head = message.split(":", 1)[0]
    return message if re.search(rf"\b{re.escape(field)}\b", head) else f"{field}: {message}"


class RefusedLaunch(dg.Failure, ValueError):
    """A launch that cannot run as given: the operator's input, not a fault of the system.

    A ``dg.Failure`` (the run fails with its message as written, never retried) whose metadata says
    ``refused_input=<field>``. Also a ``ValueError``, as pydantic's own error was, so code
    that builds a config and catches ``ValueError`` keeps working.
    """

    def __init__(self, field: str, message: str, **metadata: Any) -> None:
        super().__init__(
            description=named(field, message),
            metadata={REFUSED_INPUT: field, "refused": REFUSED_NOTE, **metadata},
            allow_retries=False,
        )
        self.field = field


def _pydantic_problem(error: Any) -> tuple[str, str]:
    """(field, reason) of one pydantic error: our validators' own message, else pydantic's short one."""
    field = str(error["loc"][0]) if error.get("loc") else "config"
    raised = (error.get("ctx") or {}).get("error")
    if isinstance(raised, Exception):
        return field, str(raised)
    return field, f"{error['msg']} (got {error.get('input')!r})"


def refused_config(exc: ValidationError) -> RefusedLaunch:
    """pydantic's refusal of a config as one readable sentence per field, never its dump."""
    problems = [_pydantic_problem(error) for error in exc.errors()]
    return RefusedLaunch(problems[0][0], "; ".join(named(field, reason) for field, reason in problems))


_DUMP_FIELD = re.compile(r"^(\w[\w.]*)$")
_DUMP_REASON = re.compile(r"^  (?:Value error, |Assertion failed, )?(.*?)(?: \[type=.*\])?$")


def refused_config_text(dump: str) -> tuple[str, str] | None:
    """(first field, sentence) from the text of a pydantic ValidationError, or None if it is not one.

    For the alert sensor, which sees a failure as text only: a config class that is not a ``LaunchConfig``
    still never puts pydantic's dump in front of on-call.
    """
    if not re.search(r"\d+ validation errors? for ", dump):
        return None
    lines = dump.splitlines()
    problems = [
        (field.group(1), reason.group(1))
        for line, below in zip(lines, lines[1:], strict=False)
        if (field := _DUMP_FIELD.match(line)) and (reason := _DUMP_REASON.match(below))
    ]
    if not problems:
        return None
    return problems[0][0], "; ".join(named(field, reason) for field, reason in problems)


class LaunchConfig(dg.Config):
    """Op config an operator writes in the launchpad. A value that passes Dagster's schema but not the
    config's own checks (its validators, a bound) refuses the launch naming the field (``RefusedLaunch``)
    instead of failing the run with pydantic's dump."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise refused_config(exc) from None


# The Dagster Enum of a code location's tables: the launchpad offers its values, and a launch naming another
# table is refused by Dagster's config validation (the launchpad's, GraphQL's) before any run exists.
TABLE_ENUM = "OutboxTableName"


def table_field(tables: Sequence[str], description: str) -> dg.Field:
    """The ``table`` field of a launch: one of ``tables`` (the code location's declared tables), the default
    when it is the only one. With none declared, a plain string the op refuses naming that none is."""
    names = sorted(tables)
    if not names:
        return dg.Field(str, default_value="", description=description)
    choice = dg.Enum(TABLE_ENUM, [dg.EnumValue(name) for name in names])
    if len(names) == 1:
        return dg.Field(choice, default_value=names[0], description=f"{description} The only one: {names[0]}.")
    return dg.Field(choice, description=f"{description} One of: {', '.join(names)}.")


def launch_schema(config_class: type[LaunchConfig], tables: Sequence[str]) -> dict[str, dg.Field]:
    """The op config of ``config_class`` (its fields, defaults and descriptions), its ``table`` one of ``tables``.

    The op builds the config from ``context.op_config`` (``config_class(**context.op_config)``): what Dagster's
    schema cannot say (a time, a bound, the rule of a filter) is still the config's own checks, a refused launch.
    """
    fields = dict(config_class.to_fields_dict())  # a copy: Dagster caches the class's own, which must stay as it is
    fields["table"] = table_field(tables, fields["table"].description or "The outbox table.")
    return fields


def _did_you_mean(table_name: str, settings: Settings) -> str:
    # A typo is the likely mistake of a launch; the settings' own advice (add a section) fits a new table.
    close = difflib.get_close_matches(table_name, sorted(settings.tables), n=1)
    return f". Did you mean {close[0]!r}?" if close else ""


def resolve_table(settings: Settings, table_name: str, field: str = "table") -> TableSettings:
    """The table's settings; a name that is not a table is a refused launch that names the tables that exist.

    A table whose section of the settings cannot be used is the deployment's problem, not the launcher's: a
    plain run failure (it pages), with the settings' own message.
    """
    if settings.problem:  # the settings cannot be read at all: the deployment's problem, it pages
        raise dg.Failure(description=settings.problem, allow_retries=False)
    known = ", ".join(sorted(settings.tables))
    if not table_name:  # no table is anyone's default: the launch names the project's own
        raise RefusedLaunch(
            field, f"{field}: name the outbox table; this project's are: {known or 'none declared'}", known_tables=known
        )
    try:
        return settings.table(table_name)
    except (UnknownTable, InvalidTableName) as exc:
        # Led by the field: the settings' own message says "table" in a sentence, not as the launchpad's field.
        raise RefusedLaunch(
            field, f"{field}: {str(exc).rstrip('.')}{_did_you_mean(table_name, settings)}", known_tables=known
        ) from None
    except ConfigError as exc:
        raise dg.Failure(
            description=str(exc), metadata={"table": table_name, "known_tables": known}, allow_retries=False
        ) from None


def plain(value: Any) -> Any:
    """``value`` with every enum member (a state, a code, a severity: core's ``StrEnum``s) as its plain text, in
    dicts and lists too: Dagster serializes only the enums it knows."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {plain(key): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    return value


def metadata_values(values: dict[str, Any]) -> dict[str, Any]:
    """Dagster metadata from plain values: None becomes the text '-', dicts become JSON."""
    out: dict[str, Any] = {}
    for key, value in plain(values).items():
        if value is None:
            out[key] = dg.MetadataValue.text("-")
        elif isinstance(value, (dict, list)):
            out[key] = dg.MetadataValue.json(value)
        elif isinstance(value, float):
            out[key] = dg.MetadataValue.float(round(value, 4))
        else:
            out[key] = value
    return out


def audited_reason(value: str) -> str:
    """A launch's ``reason``, kept in the audit as written: one printable line (the CLI's --reason's rule), or a
    ValueError that Dagster shows on the launch."""
    try:
        return free_text(value, "reason")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
