"""What the examples bring to the engine (core/wings.py), the part ``examples`` a project declares: seed 003's,
seed 002's and seed 004's tables, their handlers, and seed 002's handler record ``automated_email_recipients``,
which the welcome handler writes in the relay's transaction (so the relay and the maintainer may read and
insert there). Its migrations: sql/parts/examples/."""

from outbox_pipelines.core.storage.roles import MAINTAINER, RELAY, Grant
from outbox_pipelines.core.wings import Wing

WELCOME_RECORD = "automated_email_recipients"
_WRITE_THE_RECORD = (Grant(WELCOME_RECORD, ("SELECT", "INSERT")),)

WING = Wing(
    name="examples",
    shipped_tables={
        # seed 003: memory writes, dedup by (topic, payload_sha)
        "outbox_memory": {"destination": "paper", "preset": "memory", "mode": "competing", "dedup": True},
        # seed 002: member events to in-process handlers (welcome email); success deletes the row
        "outbox_members": {
            "destination": "handlers",
            "handlers": "outbox_pipelines.examples.members:registry",
            "preset": "generic",
            # Ghost: newStatus = (retryCount + 1) <= MAX_RETRIES ? PENDING : FAILED, MAX_RETRIES = 5:
            # the first attempt and 5 retries, FAILED on the 6th failure.
            "max_attempts": 6,
            "on_success": "delete",
            "mode": "single-active",
        },
        # seed 004: in-process handlers, single-active relay
        "outbox_events": {
            "destination": "handlers",
            "handlers": "outbox_pipelines.examples.handlers:registry",
            "preset": "generic",
            "mode": "single-active",
        },
    },
    shared_tables={WELCOME_RECORD: "seed 002's welcome emails"},
    engine_role_grants={RELAY: _WRITE_THE_RECORD, MAINTAINER: _WRITE_THE_RECORD},
    migrations="parts/examples",
)
