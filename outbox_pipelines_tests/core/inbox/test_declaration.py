"""An inbox is declared in outbox.toml (``[inboxes.NAME]``, its ``window``) and created by ``db upgrade``, as an
outbox table is; a section that cannot be used is refused naming the file and the inbox."""

import psycopg
import pytest

from outbox_pipelines import Inbox
from outbox_pipelines.core.errors import ConfigError, UnknownTable
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.settings.inboxes import DEFAULT_WINDOW_S
from outbox_pipelines_tests.conftest import run_cli

TOML = """
[tables.billing_outbox]
destination = "paper"

[inboxes.billing_inbox]
window = "2d"

[inboxes.audit_inbox]
"""


def test_db_upgrade_creates_every_declared_inbox_and_says_which(cli_env, tmp_path, db_url):
    (tmp_path / "outbox.toml").write_text(TOML)
    env = {**cli_env, "OUTBOX_CONFIG": str(tmp_path / "outbox.toml")}
    first = run_cli(env, "db", "upgrade")
    assert first.returncode == 0, first.stderr
    assert "created inbox table audit_inbox" in first.stdout
    assert "created inbox table billing_inbox" in first.stdout
    assert "inbox tables of this project: audit_inbox, billing_inbox" in first.stdout
    again = run_cli(env, "db", "upgrade")
    assert again.returncode == 0, again.stderr
    assert "created inbox table" not in again.stdout
    with psycopg.connect(db_url) as conn:
        assert Inbox("billing_inbox").receive(conn, "m-1", consumer="billing")
        conn.commit()
        (key,) = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'billing_inbox'::regclass "
            "AND contype = 'p'"
        ).fetchone()
    assert key == "PRIMARY KEY (consumer, message_id)"


def test_db_upgrade_dry_run_and_sql_name_the_inboxes_it_would_create(cli_env, tmp_path):
    (tmp_path / "outbox.toml").write_text(TOML)
    env = {**cli_env, "OUTBOX_CONFIG": str(tmp_path / "outbox.toml")}
    dry = run_cli(env, "db", "upgrade", "--dry-run")
    assert "would create inbox table billing_inbox" in dry.stdout, dry.stderr
    script = run_cli(env, "db", "upgrade", "--sql")
    assert "SELECT outbox_create_inbox('billing_inbox');" in script.stdout, script.stderr


def test_the_window_is_read_with_a_default_of_seven_days(tmp_path):
    (tmp_path / "outbox.toml").write_text(TOML)
    inboxes = load_settings(env={}, path=tmp_path / "outbox.toml").inboxes
    assert inboxes["billing_inbox"].window_s == 2 * 86400
    assert inboxes["audit_inbox"].window_s == DEFAULT_WINDOW_S == 7 * 86400
    assert inboxes["audit_inbox"].cleaner_enabled


@pytest.mark.parametrize(
    "section, said",
    [
        ('[inboxes.billing_inbox]\nwindow = "soon"', "[inboxes.billing_inbox] window: cannot read duration 'soon'"),
        ('[inboxes.billing_inbox]\nwindow = "0s"', "[inboxes.billing_inbox] window must be more than 0"),
        ("[inboxes.billing_inbox]\nretention = 3", "[inboxes.billing_inbox]: unknown keys ['retention']"),
        ("[inboxes.Billing]\n", "[inboxes.Billing]: invalid inbox table name 'Billing'"),
        ("[tables.billing_inbox]\n[inboxes.billing_inbox]\n", "declared as an outbox table too"),
        ("inboxes = 3\n", "inboxes must be a table of tables"),
    ],
)
def test_a_section_that_cannot_be_used_is_refused_naming_the_file_and_the_inbox(tmp_path, section, said):
    path = tmp_path / "outbox.toml"
    path.write_text(section)
    with pytest.raises(ConfigError) as refused:
        load_settings(env={}, path=path)
    assert said in str(refused.value)
    assert str(path) in str(refused.value)


def test_relaying_an_inbox_is_told_it_is_one_and_an_empty_project_says_so(tmp_path):
    (tmp_path / "outbox.toml").write_text(TOML)
    settings = load_settings(env={"OUTBOX_CONFIG": str(tmp_path / "outbox.toml")})
    with pytest.raises(UnknownTable, match=r"'billing_inbox' is an inbox \(\[inboxes.billing_inbox\]\), not an out"):
        settings.table("billing_inbox")
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(UnknownTable, match=r"no settings for table 'nope'; no table is declared\. Add a \[tables"):
        load_settings(env={"OUTBOX_CONFIG": str(tmp_path / "empty.toml")}).table("nope")
