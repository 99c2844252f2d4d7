"""One ``[tables.NAME]`` section checked and read into a table's ``TableSettings``.

The keys a section may carry are the registry's (registry/table_keys.py): a key it does not document is
refused, naming the file, the section and the known keys. Where the table's messages go is destination.py's.
"""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from outbox_pipelines.core import wings
from outbox_pipelines.core.errors import ConfigError, InvalidTableName, MissingSecret
from outbox_pipelines.core.names import validate_table_name
from outbox_pipelines.core.retry import RetryPolicy, preset
from outbox_pipelines.core.settings.already_processed import DEFAULT_ALREADY_PROCESSED, AlreadyProcessed
from outbox_pipelines.core.settings.destination import Where, table_destination
from outbox_pipelines.core.settings.environment import GlobalSettings
from outbox_pipelines.core.settings.registry import TABLE_KEYS, TABLE_KEYS_BY_NAME
from outbox_pipelines.core.settings.tables import (
    AUDIT_MODES,
    CLAIM_MODES,
    DEFAULT_GROUP,
    MODES,
    ORDERING_POLICIES,
    SUCCESS_POLICIES,
    THRESHOLD_KEYS,
    CheckThresholds,
    TableSettings,
)
from outbox_pipelines.core.settings.values import check_kind, did_you_mean, one_of, parse_duration, positive, whole

# Keys a shipped table's defaults carry that a user does not write (a wing's shipped tables).
INTERNAL_KEYS = {"url_from_env"}
_GROUP = re.compile(r"^[a-z0-9_]{1,40}$")


def check_section(name: str, section: Mapping[str, Any], source: Path | None) -> None:
    """A section's name and keys (ConfigError naming the file, the section and what to write)."""
    where = f"{source}: " if source else ""
    try:
        validate_table_name(name)
    except InvalidTableName as exc:
        raise ConfigError(f"{where}[tables.{name}]: {exc}") from None
    unknown = set(section) - TABLE_KEYS - INTERNAL_KEYS
    if unknown:
        raise ConfigError(
            f"{where}[tables.{name}] has unknown keys {sorted(unknown, key=str)}{did_you_mean(unknown, TABLE_KEYS)}; "
            f"known keys: {sorted(TABLE_KEYS)}"
        )
    for key, value in section.items():
        # None: a YAML key left empty, or a {{ env.NAME }} of an unset variable, read as not given (the rules
        # that need the key say so in their own words: "has no url").
        if key in TABLE_KEYS_BY_NAME and value is not None:
            check_kind(value, TABLE_KEYS_BY_NAME[key].kind, f"{where}[tables.{name}] {key}")


def _retry_policy(section: Mapping[str, Any], env: GlobalSettings, where: str) -> tuple[str, RetryPolicy]:
    """The table's preset, with the section's overrides (and the seeds' variable for its preset's attempts)."""
    preset_name = section.get("preset", "generic")
    attempts_from = {"generic": "relay_max_attempts", **wings.preset_attempts_from()}.get(preset_name)
    env_max = getattr(env, attempts_from) if attempts_from else None
    policy = preset(preset_name).with_overrides(
        base_s=parse_duration(section["base"], f"{where} base") if "base" in section else None,
        max_s=parse_duration(section["max_backoff"], f"{where} max_backoff") if "max_backoff" in section else None,
        max_attempts=section.get("max_attempts", env_max),
        jitter=section.get("jitter"),
    )
    return preset_name, policy


def _already_processed(section: Mapping[str, Any], where: str) -> AlreadyProcessed:
    rules = section.get("already_processed", DEFAULT_ALREADY_PROCESSED)
    if not isinstance(rules, (list, tuple)):
        raise ConfigError(
            f'{where} already_processed must be a list of rules like "status=already_processed" '
            f"or a phrase, got {rules!r}"
        )
    try:
        return AlreadyProcessed.parse(rules, f"{where} already_processed")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _thresholds(section: Mapping[str, Any], where: str) -> CheckThresholds:
    # Any: durations are floats, counts ints, each the type of its CheckThresholds field.
    thresholds: dict[str, Any] = {}
    for key, (attribute, kind) in THRESHOLD_KEYS.items():
        if key in section:
            value = parse_duration(section[key], f"{where} {key}") if kind == "duration" else section[key]
            if kind == "count" and (not isinstance(value, int) or value < 0):
                raise ConfigError(f"{where} {key} must be a whole number >= 0, got {value!r}")
            thresholds[attribute] = value
    return CheckThresholds(**thresholds)


def _paused_topics(section: Mapping[str, Any], where: str) -> tuple[str, ...]:
    paused = section.get("paused_topics", [])
    if not isinstance(paused, list) or not all(isinstance(t, str) for t in paused):
        raise ConfigError(f"{where} paused_topics must be a list of topic names")
    return tuple(paused)


def _group(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _GROUP.fullmatch(value):
        raise ConfigError(f"{where} group must be lowercase letters, digits and _ (at most 40), got {value!r}")
    return value


def build_table_settings(
    name: str, section: Mapping[str, Any], env: GlobalSettings, *, without_secrets: bool = False
) -> TableSettings:
    """A table's settings. ``without_secrets``: a credential whose variable is not set is left out (the table
    then has no destination credential, and ``secrets_missing`` says which) instead of refused."""
    where = f"[tables.{name}]"
    preset_name, policy = _retry_policy(section, env, where)
    secrets_missing = None
    try:
        goes = table_destination(name, section, env, policy, where)
    except MissingSecret as exc:
        if not without_secrets:
            raise
        goes, secrets_missing = Where(str(section["destination"]), None, None, None), str(exc)
    thresholds = _thresholds(section, where)
    paused = _paused_topics(section, where)
    return TableSettings(
        name=name,
        destination=goes.destination,
        url=goes.url,
        token=goes.token,
        already_processed=_already_processed(section, where),
        delivers_nowhere=goes.delivers_nowhere,
        secrets_missing=secrets_missing,
        broker=goes.broker,
        signing_secret=goes.signing_secret,
        handlers=section.get("handlers"),
        timeout_s=parse_duration(section.get("timeout", "5s"), f"{where} timeout"),
        transport=section.get("transport", "aiohttp-native"),
        preset=preset_name,
        retry=policy,
        mode=one_of(section.get("mode", "single-active"), MODES, f"{where} mode"),
        on_success=one_of(section.get("on_success", "mark_sent"), SUCCESS_POLICIES, f"{where} on_success"),
        ordering=one_of(section.get("ordering", "park"), ORDERING_POLICIES, f"{where} ordering"),
        claim=one_of(section.get("claim", "auto"), CLAIM_MODES, f"{where} claim"),
        group=_group(section.get("group", DEFAULT_GROUP), where),
        audit=one_of(section.get("audit", "all"), AUDIT_MODES, f"{where} audit"),
        dedup=bool(section.get("dedup", False)),
        batch_size=int(section.get("batch_size", env.batch_size)),
        batch_bytes=whole(section.get("batch_bytes", env.batch_bytes), f"{where} batch_bytes"),
        handler_threads=int(section.get("parallelism", env.handler_threads)),
        requests_in_flight=int(section.get("concurrency", 32)),
        lease_s=parse_duration(section.get("lease", env.lock_ttl_s), f"{where} lease"),
        hold_s=positive(parse_duration(section.get("hold", "1s"), f"{where} hold"), f"{where} hold"),
        stuck_threshold_s=parse_duration(
            section.get("stuck_threshold", env.stuck_threshold_s), f"{where} stuck_threshold"
        ),
        retention_s=parse_duration(section.get("retention", env.cleaner_retention_s), f"{where} retention"),
        paused_topics=paused,
        relay_enabled=bool(section.get("relay_enabled", env.relay_enabled)),
        cleaner_enabled=bool(section.get("cleaner_enabled", env.cleaner_enabled)),
        idle_sleep_s=env.idle_sleep_s,
        poll_interval_s=env.poll_interval_s,
        checks=thresholds,
        max_retry_after_s=positive(
            parse_duration(section.get("max_retry_after", "300s"), f"{where} max_retry_after"),
            f"{where} max_retry_after",
        ),
        circuit_threshold=whole(section.get("circuit_threshold", 10), f"{where} circuit_threshold"),
        probe_interval_s=positive(
            parse_duration(section.get("probe_interval", "10s"), f"{where} probe_interval"), f"{where} probe_interval"
        ),
    )
