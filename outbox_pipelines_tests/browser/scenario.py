"""The on-call scenario (issue 43): a project whose tables are in the states an on-call engineer meets, under a
real ``outbox-pipelines dev``.

Used by the browser tests (``conftest.py`` here, a few tables) and by ``scripts/oncall_screenshots.py`` (twenty
tables, the docs' screenshots). Everything is a real process or a real socket on 127.0.0.1:

- a project directory of its own (``pyproject.toml`` and ``outbox.toml``), with ``http`` tables sending to an
  ``HttpSink`` that answers 400 to the poison messages' event ids (they die at their first attempt with
  the sink's error text);
- ``DEAD``: dead messages (BAD_REQUEST, with the destination's answer as their error, and one that died of a
  503 and is delivered when replayed), more than its ``dead_error``: failing;
- ``BLOCKED``: two ordering keys, each held back by its dead head (``ordering = "park"``, the default);
- ``DOWN``: a destination nothing listens on (connection refused: its messages retry);
- ``PAUSED``: a topic paused in the table's section (``paused_topics``), its messages waiting as pending;
- ``BROKEN`` (twenty tables only): a section with an invalid value (the relay check and one alert say so);
- healthy tables, each with a few messages that the relay delivers.

Every table is relayed once before ``dev`` starts (``outbox-pipelines relay --group default --once``), so the
on-call sensor's first tick already sees the poison messages dead and nothing else waiting. ``dev`` runs in the project
directory with its defaults: OUTBOX_UI_URL is not set (the links must name the port dev serves on), alerts go
to a ``WebhookReceiver``. ``close()`` stops what was started, by pid (dev's sessions included).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.storage.schema import create_table
from outbox_pipelines_tests.drills.conftest import REPO, DevProcess, WebhookReceiver
from outbox_pipelines_tests.helpers import QueriesDatabase
from outbox_pipelines_tests.processes import CLI, free_port, tail
from outbox_pipelines_tests.sink import HttpSink

DEAD, BLOCKED, DOWN, PAUSED, BROKEN = (
    "orders_outbox",
    "payments_outbox",
    "crm_outbox",
    "notifications_outbox",
    "ledger_outbox",
)
HEALTHY = (
    "billing_outbox",
    "inventory_outbox",
    "shipping_outbox",
    "search_outbox",
    "invoices_outbox",
    "users_outbox",
    "catalog_outbox",
    "reviews_outbox",
    "loyalty_outbox",
    "refunds_outbox",
    "tax_outbox",
    "fraud_outbox",
    "returns_outbox",
    "pricing_outbox",
    "audit_outbox",
)
PAUSED_TOPIC = "email.marketing"
# The dead messages of DEAD (the newest last) and what the destination answered them.
DEAD_EVENTS = ("order-1041", "order-1042", "order-1043")
DEAD_TENANT = "acme"
# DEAD pages at this many dead messages (its dead_letters check at ERROR: the table is failing); BLOCKED stays at
# the default thresholds (blocked_keys at WARN: a warning).
DEAD_ERROR = 2
REJECTION_DETAIL = "quantity must be positive"
REJECTION = b'{"error": "invalid_order", "detail": "quantity must be positive"}'
# A dead message that a replay delivers: the destination answered it 503 once (DEAD gives up at the first
# failure: max_attempts = 1), and accepts it from then on.
REPLAYABLE = "order-1044"
UNAVAILABLE = b'{"error": "unavailable", "detail": "maintenance, try again later"}'
# BLOCKED's keys, each with its dead head and the messages it holds back.
BLOCKED_KEYS = ("account-7", "account-9")
HELD_PER_KEY = 2
ONCALL_SENSOR = "outbox_oncall"

SENSOR_TICKS = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { ticks(limit: 5) { status timestamp skipReason error { message } } } }
  }
}"""
REPOSITORY = "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"


def blocked_head(key: str) -> str:
    return f"pay-{key}-1"


@dataclass(frozen=True)
class Layout:
    """Which tables the scenario declares."""

    healthy: tuple[str, ...]
    broken: bool

    @classmethod
    def tables(cls, n: int) -> "Layout":
        """``n`` tables in all: the four failing ones, BROKEN from 20 on, the rest healthy."""
        broken = n >= 20
        healthy = n - 4 - int(broken)
        assert 1 <= healthy <= len(HEALTHY), f"{n} tables: between 5 and {len(HEALTHY) + 5}"
        return cls(HEALTHY[:healthy], broken)

    @property
    def names(self) -> list[str]:
        return [DEAD, BLOCKED, DOWN, PAUSED, *([BROKEN] if self.broken else []), *self.healthy]


def _rejecting(poison: set[str]) -> Callable[[str, int, Any], tuple[int, dict[str, str], bytes] | None]:
    def script(key: str, attempt: int, body: Any) -> tuple[int, dict[str, str], bytes] | None:
        if key in poison:
            return 400, {"Content-Type": "application/json"}, REJECTION
        if key == REPLAYABLE and attempt == 1:
            return 503, {"Content-Type": "application/json"}, UNAVAILABLE
        return None

    return script


class OncallScenario(QueriesDatabase):
    """The project, its data and its ``dev``; ``code_root`` is put first on PYTHONPATH (another checkout's code)."""

    def __init__(
        self,
        database_url: str,
        *,
        tables: int = 5,
        code_root: Path = REPO,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.database_url = database_url
        self.layout = Layout.tables(tables)
        self.code_root = code_root
        self.on_close = on_close
        self.tmp = Path(tempfile.mkdtemp(prefix="outbox-oncall-"))
        self.project = self.tmp / "platform_service"
        self.project.mkdir()
        self.poison = {*DEAD_EVENTS, *(blocked_head(k) for k in BLOCKED_KEYS)}
        self.sink = HttpSink(script=_rejecting(self.poison)).start()
        self.receiver = WebhookReceiver().start()
        port = free_port()
        self.ui_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DAGSTER_"))}
        self.env = {
            **env,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(code_root), str(REPO)])),
            "PYTHONUNBUFFERED": "1",
            "OUTBOX_DATABASE_URL": database_url,
            "OUTBOX_ALERT_WEBHOOK_URL": self.receiver.url,
            "DAGSTER_HOME": str(self.tmp / "dagster_home"),
        }
        self.dev_log = self.tmp / "dev.log"
        self.dev = DevProcess(port, self.dev_log, self.env, self.project)

    # -- the project and its data ----------------------------------------------------------------
    def write_project(self) -> None:
        (self.project / "pyproject.toml").write_text('[project]\nname = "platform_service"\nversion = "1.0.0"\n')
        down = f"http://127.0.0.1:{free_port()}/crm"  # nothing listens there: connection refused

        def section(name: str, url: str, extra: str = "") -> str:
            return f'[tables.{name}]\ndestination = "http"\nurl = "{url}"\n{extra}'

        sections = [
            section(DEAD, self.sink.url + DEAD, f"dead_error = {DEAD_ERROR}\nmax_attempts = 1\n"),
            section(BLOCKED, self.sink.url + BLOCKED),
            section(DOWN, down),
            section(PAUSED, self.sink.url + PAUSED, f'paused_topics = ["{PAUSED_TOPIC}"]\n'),
            *([section(BROKEN, self.sink.url + BROKEN, 'mode = "compting"\n')] if self.layout.broken else []),
            *(section(name, self.sink.url + name) for name in self.layout.healthy),
        ]
        (self.project / "outbox.toml").write_text("\n".join(sections))
        for name in self.layout.names:
            create_table(self.database_url, name)

    def seed(self) -> None:
        """Every table's messages; then the failing tables relayed once, so their messages die, wait or retry."""
        batches: dict[str, list[Message]] = {
            DEAD: [
                *(
                    Message(
                        "order.submitted", {"order_id": f"o-{i}", "qty": 1}, event_id=f"order-{i}", tenant_id="globex"
                    )
                    for i in range(1031, 1036)
                ),
                Message("order.submitted", {"order_id": REPLAYABLE, "qty": 2}, event_id=REPLAYABLE, tenant_id="globex"),
                *(
                    Message("order.submitted", {"order_id": e, "qty": -1}, event_id=e, tenant_id=DEAD_TENANT)
                    for e in DEAD_EVENTS
                ),
            ],
            BLOCKED: [
                Message(
                    "payment.captured",
                    {"account": key, "step": step},
                    event_id=f"pay-{key}-{step}",
                    tenant_id="acme",
                    ordering_key=key,
                )
                for key in BLOCKED_KEYS
                for step in range(1, HELD_PER_KEY + 2)
            ],
            DOWN: [Message("contact.updated", {"contact": i}, event_id=f"crm-{i}") for i in range(4)],
            PAUSED: [
                *(Message(PAUSED_TOPIC, {"campaign": i}, event_id=f"mkt-{i}") for i in range(6)),
                *(Message("email.receipt", {"receipt": i}, event_id=f"rcpt-{i}") for i in range(3)),
            ],
        }
        for name in self.layout.healthy:
            batches[name] = [Message("record.changed", {"n": i}, event_id=f"{name}-{i}") for i in range(3)]
        with self.connect(autocommit=False) as conn:
            for name, messages in batches.items():
                Outbox(name).enqueue_many(conn, messages, outside_transaction=True)
            conn.commit()
        # One relay of the project's group, once, as a group run relays it: the healthy tables are delivered, the
        # poison messages die, DOWN's retry, PAUSED's topic waits. dev then starts from a settled state (no lag).
        relay = subprocess.run(
            [*CLI, "relay", "--group", "default", "--once", "--quiet"],
            env=self.env,
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=180,
        )
        # Its exit code says what went wrong in the scenario on purpose (DOWN failing, BROKEN left out): what counts
        # is that it ran, and that the dead messages are there (below).
        if "Traceback" in relay.stdout + relay.stderr or "relaying group default" not in relay.stderr + relay.stdout:
            raise RuntimeError(f"relay --group default --once exited {relay.returncode}:\n{relay.stdout}{relay.stderr}")
        dead = self.scalar(f"SELECT count(*) FROM {DEAD} WHERE status = 'dead'")
        if dead != len(DEAD_EVENTS) + 1:
            raise RuntimeError(f"{DEAD}: {dead} dead messages after its relay, expected {len(DEAD_EVENTS) + 1}")

    def trickle(self, per_table: int = 2, prefix: str = "more") -> None:
        """A few more messages into every healthy table (the relay runs that the Runs list shows)."""
        stamp = time.monotonic_ns()
        with self.connect(autocommit=False) as conn:
            for name in self.layout.healthy:
                Outbox(name).enqueue_many(
                    conn,
                    [
                        Message("record.changed", {"n": i}, event_id=f"{name}-{prefix}-{stamp}-{i}")
                        for i in range(per_table)
                    ],
                    outside_transaction=True,
                )
            conn.commit()

    def dead_ids(self) -> dict[str, int]:
        rows = self.query(f"SELECT event_id, id FROM {DEAD} WHERE status = 'dead'")
        return {r["event_id"]: r["id"] for r in rows}

    # -- dev -----------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240) -> float:
        """Project, data, then dev until its UI answers and the on-call sensor has ticked once; the seconds it took."""
        began = time.monotonic()
        self.write_project()
        self.seed()
        self.dev.start()
        self.dev.wait_ready(timeout_s=timeout_s)
        self.wait_oncall_tick(timeout_s=timeout_s)
        return time.monotonic() - began

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.dev.graphql(query, variables)

    def repository(self) -> dict[str, str]:
        [repo] = self.graphql(REPOSITORY)["repositoriesOrError"]["nodes"]
        return {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}

    def wait_oncall_tick(self, timeout_s: float) -> dict[str, Any]:
        """Until the on-call sensor has finished a tick (its check evaluations are then on the table assets)."""
        selector = {**self.repository(), "sensorName": ONCALL_SENSOR}
        deadline = time.monotonic() + timeout_s
        ticks: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            if not self.dev.running:
                raise RuntimeError(f"outbox-pipelines dev exited:\n{tail(self.dev_log, 40)}")
            answer = self.graphql(SENSOR_TICKS, {"selector": selector})["sensorOrError"]
            ticks = (answer.get("sensorState") or {}).get("ticks") or []
            done = [t for t in ticks if t["status"] in ("SUCCESS", "SKIPPED")]
            if done:
                return done[0]
            time.sleep(1.0)
        raise RuntimeError(f"the {ONCALL_SENSOR} sensor did not finish a tick in {timeout_s:.0f} s: {ticks}")

    def dismiss_community_popup(self) -> None:
        """The UI opens a "Join the Dagster community" dialog until the instance records it as seen."""
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(self.ui_url + "/graphql", json={"query": "mutation { setNuxSeen }"}, timeout=30, trust_env=False)

    def diagnostics(self) -> str:
        alerts = "\n".join(str(a.body)[:400] for a in self.receiver.alerts) or "(no alerts)"
        return f"tmp {self.tmp}\n--- dev.log ---\n{tail(self.dev_log, 60)}\n--- alerts ---\n{alerts}"

    def close(self) -> None:
        self.dev.stop(signal.SIGTERM, grace_s=60)
        self.dev.kill_leftovers()
        self.sink.stop()
        self.receiver.stop()
        if self.on_close is not None:
            self.on_close()
        if os.environ.get("OUTBOX_DRILL_KEEP_TMP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"kept {self.tmp}", file=sys.stderr)
