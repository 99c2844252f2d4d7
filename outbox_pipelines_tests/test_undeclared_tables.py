"""An outbox table in the database that the project declares nowhere is not silent: `status` names it with what
waits there, since no relay of this project will deliver it."""

import json

from outbox_pipelines import Message, Outbox
from outbox_pipelines_tests.conftest import run_cli


def test_status_names_a_table_no_project_here_declares_with_its_waiting_messages(cli_env, conn, tmp_path):
    created = run_cli(cli_env, "db", "create-table", "other_team_outbox", cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    with conn.transaction():
        Outbox("other_team_outbox").enqueue_many(conn, [Message(topic="t", payload={"n": n}) for n in range(3)])
    (tmp_path / "outbox.toml").write_text('shipped_tables = false\n\n[tables.shop_outbox]\ndestination = "paper"\n')
    run_cli(cli_env, "db", "create-table", "shop_outbox", cwd=tmp_path)
    shown = run_cli(cli_env, "status", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "declared nowhere in this project: " in shown.stdout
    assert "other_team_outbox (3 waiting)" in shown.stdout
    assert "shop_outbox (" not in shown.stdout.split("declared nowhere")[1]  # declared: not listed
    # --json keeps its shape (the declared tables); --table asks about one table only.
    as_json = run_cli(cli_env, "status", "--json", cwd=tmp_path)
    assert [row["table"] for row in json.loads(as_json.stdout)] == ["shop_outbox"]
    one = run_cli(cli_env, "status", "--table", "shop_outbox", cwd=tmp_path)
    assert "declared nowhere" not in one.stdout
