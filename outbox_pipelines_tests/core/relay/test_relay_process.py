"""What run_table_relay (the CLI relay and the Dagster op) does to its process: it freezes the objects
alive at start-up out of the garbage collector's full passes, once."""

import subprocess
import sys

from outbox_pipelines.core.relay import run_table_relay, table_relay
from outbox_pipelines.core.settings import GlobalSettings, Settings
from outbox_pipelines_tests.core.relay.events import EVENTS, events_settings
from outbox_pipelines_tests.helpers import ScriptedDestination, enqueue_n


def test_a_process_freezes_its_startup_objects_once():
    script = (
        "import gc\n"
        "from outbox_pipelines.core.relay.table_relay import freeze_startup_objects\n"
        "before = gc.get_freeze_count()\n"
        "freeze_startup_objects()\n"
        "first = gc.get_freeze_count()\n"
        "garbage = [[] for _ in range(1000)]\n"
        "freeze_startup_objects()\n"
        "print(before, first, gc.get_freeze_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    before, first, again = map(int, out.split())
    assert before == 0 and first > 10_000  # every imported module's objects, Dagster's not even loaded
    assert again == first  # the later objects stay collectable


def test_run_table_relay_freezes_before_relaying(db_url, conn, monkeypatch):
    calls = []
    monkeypatch.setattr(table_relay, "freeze_startup_objects", lambda: calls.append("frozen"))
    enqueue_n(conn, EVENTS, 2)
    settings = Settings(GlobalSettings.from_env({}), {EVENTS: events_settings()}, None)
    report = run_table_relay(db_url, settings, EVENTS, once=True, destination=ScriptedDestination())
    assert (calls, report.sent) == (["frozen"], 2)
