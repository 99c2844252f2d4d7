"""What a table section's problem stops, as an on-call engineer and a deploy pipeline meet it.

- A credential variable the destination names (``signing_secret_env``, ``url_env``, ``token_env``, ...) that is not
  set in this shell stops only what delivers: the engineer at 3 a.m., who holds the database URL and not the
  webhook's signing secret, still sees the table in ``status``, replays, requeues and cleans it, and enqueues.
- A real mistake (an unknown key, an invalid name) is told by ``db upgrade`` too, which exits 2 like every command
  that leaves a table out, instead of passing the deploy step and failing at the relay's start.
"""

import json

from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses
from outbox_pipelines_tests.rows import make_dead
from outbox_pipelines_tests.scratch import DEMO_PARTS

HOOKS = "hooks_outbox"
SECRET_VARIABLE = "HOOK_SIGNING_SECRET"
DECLARATION = (
    DEMO_PARTS
    + f'[tables.{HOOKS}]\ndestination = "http"\nurl = "http://127.0.0.1:9/hook"\n'
    + f'signing_secret_env = "{SECRET_VARIABLE}"\n'
)


def _project(tmp_path, cli_env, text: str) -> dict[str, str]:
    (tmp_path / "outbox.toml").write_text(text)
    env = {k: v for k, v in cli_env.items() if k != SECRET_VARIABLE}
    return {**env, "OUTBOX_CONFIG": str(tmp_path / "outbox.toml")}


def test_without_the_destination_s_secret_an_operator_reads_replays_and_cleans_but_nothing_is_sent(
    cli_env, conn, tmp_path
):
    env = _project(tmp_path, cli_env, DECLARATION)
    upgraded = run_cli(env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr  # the migration's environment need not hold the secret
    for n in range(3):
        enqueued = run_cli(env, "enqueue", "--table", HOOKS, "--topic", "order.created", "--payload", f'{{"n": {n}}}')
        assert enqueued.returncode == 0, enqueued.stderr
    make_dead(conn, HOOKS, [1], code="BROKER_5XX")

    status = run_cli(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    shown = {row["table"]: row for row in json.loads(status.stdout)}
    counts = shown[HOOKS]["counts"]
    assert (counts["dead"], counts["pending"]) == (1, 2), counts
    dry = run_cli(env, "replay", "--table", HOOKS, "--all", "--dry-run")
    assert dry.returncode == 0 and "would replay 1" in dry.stdout, dry.stdout + dry.stderr
    for command in (["requeue-stuck"], ["clean"], ["replay", "--table", HOOKS, "--all", "--reason", "fixed"]):
        done = run_cli(env, *command)
        assert done.returncode == 0, f"{command}: {done.stderr}"
    assert statuses(conn, HOOKS) == {"pending": 3}

    relay = run_cli(env, "relay", "--table", HOOKS, "--once")
    assert relay.returncode == 2, relay.stderr
    assert f"{SECRET_VARIABLE} is not set" in relay.stderr
    group = run_cli(env, "relay", "--group", "default", "--once", "--quiet")
    assert group.returncode == 2 and f"{HOOKS} was left out" in group.stderr, group.stderr
    assert statuses(conn, HOOKS) == {"pending": 3}, "nothing delivered unsigned"


def test_db_upgrade_tells_each_section_with_a_mistake_and_exits_2(cli_env, conn, tmp_path):
    mistakes = (
        '[tables.crm_outbox]\ndestination = "paper"\nmax_attemps = 3\n\n[tables.Bad-Name]\ndestination = "paper"\n'
    )
    env = _project(tmp_path, cli_env, DECLARATION + "\n" + mistakes)
    upgraded = run_cli(env, "db", "upgrade")
    assert upgraded.returncode == 2, upgraded.stdout + upgraded.stderr
    assert "error: crm_outbox was left out" in upgraded.stderr and "did you mean 'max_attempts'" in upgraded.stderr
    assert "error: Bad-Name was left out" in upgraded.stderr and "invalid outbox table name" in upgraded.stderr
    assert HOOKS not in upgraded.stderr, "an unset credential variable is no mistake of the section"
    # The others are done all the same, the table with the typo included: its application may enqueue already.
    assert "created outbox table crm_outbox" in upgraded.stdout
    assert "created outbox table hooks_outbox" in upgraded.stdout
