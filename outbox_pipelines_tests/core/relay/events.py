"""The table these tests relay, with settings that keep a test quick."""

from outbox_pipelines_tests.conftest import table_settings

EVENTS = "outbox_events"


def events_settings(**overrides):
    return table_settings(EVENTS, **{"mode": "competing", "idle_sleep_s": 0.01, **overrides})
