"""The checks: a table's state graded against its thresholds (ok / warn / error), each verdict a sentence that
says what, how bad and what to do, with its figures. What the asset checks show and the alerts tell."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from outbox_pipelines.core.durations import duration_words
from outbox_pipelines.core.models import REPLAY_NEEDS_FORCE, CheckSeverity, MessageState
from outbox_pipelines.core.oncall.lock_holders import holders_text
from outbox_pipelines.core.oncall.table_status import TableStatus
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.relay.destination_health import DestinationHealth
from outbox_pipelines.core.settings import CheckThresholds
from outbox_pipelines.core.storage.paused_topics import paused_names, paused_text

CHECK_NAMES = ("lag", "dead_letters", "stuck", "backlog", "destination", "relay", "blocked_keys")


@dataclass(frozen=True)
class CheckVerdict:
    name: str
    severity: CheckSeverity
    # One sentence a person can act on: what, how bad, what to do.
    description: str
    metadata: dict[str, Any]

    @property
    def passed(self) -> bool:
        return self.severity == CheckSeverity.OK


def _grade(value: float | None, warn: float, error: float) -> CheckSeverity:
    if value is None:
        return CheckSeverity.OK
    if value >= error:
        return CheckSeverity.ERROR
    if value >= warn:
        return CheckSeverity.WARN
    return CheckSeverity.OK


def _worst(*severities: CheckSeverity) -> CheckSeverity:
    return next((grade for grade in (CheckSeverity.ERROR, CheckSeverity.WARN) if grade in severities), CheckSeverity.OK)


def _codes(counts: dict[str, int]) -> str:
    return ", ".join(f"{code}={n:,}" for code, n in counts.items())


def _lag(status: TableStatus, limits: CheckThresholds) -> CheckVerdict:
    """How late the messages waiting now are, each from when it became due: the p95 against lag_p95_*, the
    oldest against oldest_pending_*. Nothing waiting passes with 0, whatever came before: the last hour's
    deliveries (a short outage, a replayed message created days ago) are in the metadata, not the grade.
    Not due yet (a retry in backoff, a message scheduled for later) is not late; a message held behind a
    parked key is the blocked_keys check's; one of a paused topic (or of a table whose relaying is off) waits
    on purpose: counted aside, never lag. While the destination fails, the lag says it follows from it."""
    if not status.relay_enabled:
        text = (
            f"{status.table}: relaying is switched off (relay_enabled = false): {status.waiting:,} messages wait "
            "on purpose; that is a pause, not lag. Remove relay_enabled = false and reload the code location to "
            "resume."
        )
        return CheckVerdict("lag", CheckSeverity.OK, text, {**_lag_metadata(status, limits), "relay_enabled": False})
    grade = _worst(
        _grade(status.lag_now_p95_s, limits.lag_p95_warn_s, limits.lag_p95_error_s),
        _grade(status.lag_now_s, limits.oldest_pending_warn_s, limits.oldest_pending_error_s),
    )
    later = status.waiting - status.waiting_now
    aside = (
        f" ({later:,} more not due yet: retrying after a backoff, scheduled, or behind an earlier message of their key)"
        if later > 0
        else ""
    )
    if status.waiting_now:
        numbers = (
            f"lag p95 {duration_words(status.lag_now_p95_s)} (warn at {duration_words(limits.lag_p95_warn_s)}), "
            f"oldest waiting message due {duration_words(status.lag_now_s)} ago "
            f"(warn at {duration_words(limits.oldest_pending_warn_s)}), "
            f"{status.waiting_now:,} waiting{aside}"
        )
    else:
        numbers = f"nothing waiting, lag 0s{aside}"
    health = status.destination
    if grade == CheckSeverity.OK:
        text = f"{status.table}: {numbers}."
    elif health is not None and health.failing:
        text = (
            f"{status.table}: messages wait too long: {numbers}. This follows from the destination: deliveries "
            f"to {health.destination or 'it'} have failed for {duration_words(health.failing_for_s)} "
            f"({_codes(health.error_codes) or 'no code'}); the destination check's alert tells it, this one stays "
            "quiet until the destination recovers."
        )
    else:
        text = (
            f"{status.table}: messages wait too long: {numbers}. Check that a relay run is active for the table "
            "and what the destination check says."
        )
    if status.paused_topics:
        text += (
            f" Paused on purpose, not lag: {paused_text(status.paused_topics)}; {status.paused_waiting:,} "
            f"message{'' if status.paused_waiting == 1 else 's'} wait there"
            + (f", the oldest for {duration_words(status.paused_oldest_s)}" if status.paused_oldest_s else "")
            + "."
        )
    return CheckVerdict("lag", grade, text, _lag_metadata(status, limits))


def _lag_metadata(status: TableStatus, limits: CheckThresholds) -> dict[str, Any]:
    return {
        "lag_now_s": status.lag_now_s,
        "lag_now_p95_s": status.lag_now_p95_s,
        "waiting_now": status.waiting_now,
        # created → delivered over the window (the metrics' figures): shown, not graded
        "lag_p50_s": status.lag_p50_s,
        "lag_p95_s": status.lag_p95_s,
        "lag_p99_s": status.lag_p99_s,
        "lag_sample": status.lag_sample,
        "oldest_waiting_age_s": status.oldest_waiting_age_s,
        "waiting": status.waiting,
        "ready": status.ready,
        "lag_p95_warn_s": limits.lag_p95_warn_s,
        "lag_p95_error_s": limits.lag_p95_error_s,
        "oldest_waiting_warn_s": limits.oldest_pending_warn_s,
        "oldest_waiting_error_s": limits.oldest_pending_error_s,
        "paused_topics": paused_names(status.paused_topics),
        "paused_waiting": status.paused_waiting if status.paused_topics else None,
        "destination_failing": bool(status.destination and status.destination.failing) or None,
    }


def _dead_letters(status: TableStatus, limits: CheckThresholds) -> CheckVerdict:
    dead = status.counts.get(MessageState.DEAD, 0)
    grade = _grade(dead, limits.dead_warn, limits.dead_error)
    text = f"{status.table}: {dead:,} dead message{'' if dead == 1 else 's'}"
    if dead:
        top = next(iter(status.dead_by_code))
        text += (
            f" ({_codes(status.dead_by_code)}). See what died with 'outbox-pipelines replay --table "
            f"{status.table} --error-code {top} --dry-run' (or replay_dead_job, a dry run first), fix the cause, "
            "then replay."
        )
        refused = [code for code in REPLAY_NEEDS_FORCE if status.dead_by_code.get(code)]
        if refused:
            text += (
                f" {', '.join(refused)} rows are requests the destination refused or that could not be built from "
                "the message (the dry run lists each row's last error): unchanged they fail again, so replay "
                "refuses them unless forced (--force / force: true), once the message or the destination is fixed."
            )
    else:
        text += "."
    return CheckVerdict(
        "dead_letters",
        grade,
        text,
        {
            "dead": dead,
            "dead_warn": limits.dead_warn,
            "dead_error": limits.dead_error,
            **{f"dead_{code}": n for code, n in status.dead_by_code.items()},
        },
    )


def _stuck(status: TableStatus, limits: CheckThresholds) -> CheckVerdict:
    grade = _grade(status.stuck, limits.stuck_warn, limits.stuck_error)
    text = (
        f"{status.table}: {status.stuck:,} message{'' if status.stuck == 1 else 's'} held in sending past their "
        "lease or the stuck threshold"
    )
    text += (
        f"; their relay is probably gone. requeue_stuck_job (or 'outbox-pipelines requeue-stuck --table "
        f"{status.table}') returns them to pending."
        if status.stuck
        else "."
    )
    return CheckVerdict(
        "stuck",
        grade,
        text,
        {
            "stuck": status.stuck,
            "sending": status.counts.get(MessageState.SENDING, 0),
            "stuck_warn": limits.stuck_warn,
            "stuck_error": limits.stuck_error,
        },
    )


def _backlog(status: TableStatus, limits: CheckThresholds) -> CheckVerdict:
    grade = _grade(status.backlog, limits.backlog_warn, limits.backlog_error)
    text = (
        f"{status.table}: {status.backlog:,} message{'' if status.backlog == 1 else 's'} waiting "
        f"({status.ready:,} ready now; warn at {limits.backlog_warn:,})"
    )
    health = status.destination
    if grade == CheckSeverity.OK:
        text += "."
    elif health is not None and health.failing:
        text += (
            f". It follows from the destination, failing for {duration_words(health.failing_for_s)}: "
            "the destination check's alert tells it; the relay drains it once deliveries succeed."
        )
    else:
        text += ". Relay runs drain it; if it keeps growing, check the destination and add relay processes."
    if status.paused_topics and status.paused_waiting:
        text += f" {status.paused_waiting:,} of them wait in paused topics ({paused_names(status.paused_topics)})."
    return CheckVerdict(
        "backlog",
        grade,
        text,
        {
            "backlog": status.backlog,
            "pending": status.counts.get(MessageState.PENDING, 0),
            "retrying": status.counts.get(MessageState.RETRYING, 0),
            "ready": status.ready,
            "backlog_warn": limits.backlog_warn,
            "backlog_error": limits.backlog_error,
            "paused_waiting": status.paused_waiting if status.paused_topics else None,
        },
    )


def while_failing(status: TableStatus) -> str:
    """What becomes of a failing destination's messages, and what a person does: the destination check's and
    ``status``'s words. Those waiting retry by themselves; those already dead (their attempts spent, or a
    permanent refusal) wait for a replay once it recovers."""
    dead = status.counts.get("dead", 0)
    replay = "replay them once it recovers (`outbox-pipelines status` prints the commands)"
    if status.waiting and not dead:
        return (
            f"{status.waiting:,} messages wait and retry by themselves. Check the destination; nothing is lost and "
            "nothing needs replaying."
        )
    if status.waiting:
        return f"{status.waiting:,} messages wait and retry by themselves; {dead:,} are dead: {replay}."
    if dead:
        return f"no message is left to retry: {dead:,} are dead. Check the destination, then {replay}."
    return "no message waits. Check the destination before the next ones come."


def _destination(status: TableStatus, limits: CheckThresholds, delivers_nowhere: str | None = None) -> CheckVerdict:
    health = status.destination or DestinationHealth(status.table)
    grade = _grade(health.failing_for_s, limits.destination_failing_warn_s, limits.destination_failing_error_s)
    name = health.destination or "its destination"
    if health.failing:
        text = (
            f"{status.table}: deliveries to {name} have failed for {duration_words(health.failing_for_s)} "
            f"({_codes(health.error_codes) or 'no code'}); {while_failing(status)}"
        )
    elif delivers_nowhere:
        text = f"{delivers_nowhere}."
    else:
        text = f"{status.table}: {name} is accepting deliveries."
    if health.circuit_opened_at is not None:
        text += (
            " The circuit is open: one probe message at a time, no attempts spent; delivery resumes by itself "
            "on the first success."
        )
    if health.paused:
        text += f" The destination asked to slow down: paused for {duration_words(health.paused_for_s)} more."
    return CheckVerdict(
        "destination",
        grade,
        text,
        {
            "destination": health.destination,
            "failing_for_s": health.failing_for_s,
            "consecutive_failures": health.consecutive_failures,
            "error_codes": dict(health.error_codes) or None,
            "circuit": health.circuit,
            "paused_for_s": health.paused_for_s if health.paused else None,
            "last_error": health.last_error,
            "waiting": status.waiting,
            "last_success_at": health.last_success_at.isoformat() if health.last_success_at else None,
            "failing_warn_s": limits.destination_failing_warn_s,
            "failing_error_s": limits.destination_failing_error_s,
            "delivers_nowhere": delivers_nowhere is not None,
        },
    )


def _relay(status: TableStatus, limits: CheckThresholds, settings_problem: str | None = None) -> CheckVerdict:
    """Whether the table can be relayed at all: its settings can be used, its relay group can build and run it."""
    health = status.destination
    recorded = health.relay_problem if health is not None else None
    if settings_problem:
        text = (
            f"{status.table} cannot be relayed: {settings_problem}. Its {status.waiting:,} waiting messages are "
            "kept. Fix the table's section, then reload the code location; the other tables relay meanwhile."
        )
    elif recorded:
        text = (
            f"{status.table} cannot be relayed: {recorded}. Its {status.waiting:,} waiting messages are kept; "
            "the relay group tries it again by itself and the other tables relay meanwhile. Fix the cause "
            "(the group run's logs have it) and reload the code location if it is in code or settings."
        )
    else:
        text = f"{status.table}: its relay group can relay it."
    since = health.relay_problem_since if health is not None and recorded else None
    return CheckVerdict(
        "relay",
        CheckSeverity.ERROR if settings_problem or recorded else CheckSeverity.OK,
        text,
        {
            "problem": settings_problem or recorded,
            "problem_since": since.isoformat() if since else None,
            "waiting": status.waiting,
        },
    )


def _blocked_keys(status: TableStatus, limits: CheckThresholds) -> CheckVerdict:
    keys = status.blocked_keys
    grade = _grade(keys, limits.blocked_keys_warn, limits.blocked_keys_error) if keys else CheckSeverity.OK
    held = holders_text(status.table, status.lock_holders)  # who holds the keys' locks back (lock_holders.py)
    grade = CheckSeverity.WARN if held and grade == CheckSeverity.OK else grade
    if not keys:
        text = f"{status.table}: no ordering key is blocked."
    else:
        which = "; ".join(_blocked_head(k) for k in status.blocked_oldest)
        more = f"; and {keys - len(status.blocked_oldest):,} more" if keys > len(status.blocked_oldest) else ""
        ids = " ".join(f"--id {k['id']}" for k in status.blocked_oldest)
        text = (
            f"{status.table}: {keys:,} ordering key{'' if keys == 1 else 's'} blocked since "
            f"{status.blocked_since:%Y-%m-%d %H:%M:%S} UTC by a dead head, {status.blocked_messages:,} later "
            f"message{'' if status.blocked_messages == 1 else 's'} waiting behind: {which}{more}. Fix the cause, "
            f"then replay the head, and its key goes on in order: 'outbox-pipelines replay --table {status.table} "
            f"{ids} --dry-run', then without --dry-run (or replay_dead_job); or pass over it, and the rest of "
            f"its key goes without it: 'outbox-pipelines skip --table {status.table} {ids} --dry-run' "
            "(or skip_dead_job)."
        )
    return CheckVerdict(
        "blocked_keys",
        grade,
        f"{text} {held}" if held else text,
        {
            "blocked_keys": keys,
            "blocked_messages": status.blocked_messages,
            "blocked_since": status.blocked_since.isoformat() if status.blocked_since else None,
            "blocked_oldest": ", ".join(f"{k['key']} (id {k['id']})" for k in status.blocked_oldest) or None,
            "blocked_codes": ", ".join(sorted({str(k.get("error_code")) for k in status.blocked_oldest})) or None,
            "blocked_keys_warn": limits.blocked_keys_warn,
            "blocked_keys_error": limits.blocked_keys_error,
            "lock_holders": ", ".join(str(h["pid"]) for h in status.lock_holders) or None,
        },
    )


def _blocked_head(head: dict[str, Any]) -> str:
    """'key c-1: id 42 died with CONNECTION_REFUSED (connection failed: ...)': the key, its dead head, why."""
    why = head.get("error_code") or "no code"
    error = redact_text(str(head.get("error") or ""))[:160]
    return f"key {head['key']}: id {head['id']} died with {why}" + (f" ({error})" if error else "")


CHECKS: dict[str, Callable[[TableStatus, CheckThresholds], CheckVerdict]] = {
    "lag": _lag,
    "dead_letters": _dead_letters,
    "stuck": _stuck,
    "backlog": _backlog,
    "destination": _destination,
    "relay": _relay,
    "blocked_keys": _blocked_keys,
}


def evaluate_checks(
    status: TableStatus,
    limits: CheckThresholds,
    *,
    delivers_nowhere: str | None = None,
    settings_problem: str | None = None,
) -> list[CheckVerdict]:
    """The health checks of a table (CHECK_NAMES), graded against its thresholds, with their numbers.
    ``delivers_nowhere`` (TableSettings') makes the destination check say that messages go nowhere;
    ``settings_problem`` (Settings.broken) fails the relay check."""
    checks: dict[str, Callable[[TableStatus, CheckThresholds], CheckVerdict]] = {
        **CHECKS,
        "destination": partial(_destination, delivers_nowhere=delivers_nowhere),
        "relay": partial(_relay, settings_problem=settings_problem),
    }
    return [checks[name](status, limits) for name in CHECK_NAMES]
