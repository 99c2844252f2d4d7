"""The CLI relay checks the schema and the table's owner on one connection at its start: on a database whose
newest engine migration is not applied it refuses with the upgrade sentence, and relays nothing."""

from outbox_pipelines.core.storage import schema_version
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import enqueue_n, statuses

NEWEST = schema_version.needed()[-1][0]


def test_the_cli_relay_refuses_an_older_schema_and_relays_nothing(cli_env, conn):
    enqueue_n(conn, "outbox_events", 2, topic="org.changed", payload=lambda i: {"org_id": i})
    row = conn.execute("DELETE FROM outbox_schema_migrations WHERE version = %s RETURNING *", (NEWEST,)).fetchone()
    try:
        refused = run_cli(cli_env, "relay", "--table", "outbox_events", "--once")
    finally:
        conn.execute(
            "INSERT INTO outbox_schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
            (row["version"], row["name"], row["checksum"]),
        )
    assert refused.returncode != 0
    assert f"this version needs {NEWEST}" in refused.stderr and "outbox-pipelines db upgrade" in refused.stderr
    assert statuses(conn, "outbox_events") == {"pending": 2}
    relayed = run_cli(cli_env, "relay", "--table", "outbox_events", "--once")
    assert relayed.returncode == 0, relayed.stderr
    assert statuses(conn, "outbox_events") == {"sent": 2}, relayed.stdout + relayed.stderr
