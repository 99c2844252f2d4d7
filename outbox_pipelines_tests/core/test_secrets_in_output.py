"""No secret in any output (issue 9): database and broker passwords never reach stdout or stderr.

The test server listens on a Unix socket only and trusts local connections, so
the role's password is carried in the URL (as it would be in production) but
not checked; the failure cases use an unreachable TCP port, a role that does
not exist and malformed URLs.
"""

import itertools
import json
import os
import sys
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines.core.errors import ConfigError, InvalidDatabaseUrl
from outbox_pipelines.core.storage import db
from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import enqueue_n, free_port

DB_PASSWORD = "S3cretPw-xyz"
BROKER_PASSWORD = "BrokerPw-xyz"
SECRETS = (DB_PASSWORD, BROKER_PASSWORD)
_roles = itertools.count(1)


def assert_no_secret(result, *, what: str = "") -> None:
    for secret in SECRETS:
        for stream, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            assert secret not in text, f"{what}: {secret} in {stream}:\n{text}"
    assert "Traceback" not in result.stderr, f"{what}: traceback:\n{result.stderr}"


@pytest.fixture
def secret_url(db_url: str) -> Iterator[str]:
    """A URL to this test's database as a role with a password (user:password@, as in production)."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    role = f"obx_secret_{os.getpid()}_{next(_roles)}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(DB_PASSWORD)))
        for grant in (
            "GRANT ALL ON SCHEMA public TO {}",
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}",
        ):
            conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
    url = f"postgresql://{role}:{DB_PASSWORD}@/{info['dbname']}?host={info['host']}"
    with psycopg.connect(url) as check:  # the URL really works
        assert check.execute("SELECT current_user").fetchone()[0] == role
    yield url
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
def env(cli_env, secret_url, http_sink) -> dict[str, str]:
    base = http_sink.url.split("://", 1)[1]
    return {
        **cli_env,
        "OUTBOX_DATABASE_URL": secret_url,
        "OUTBOX_BROKER_URL": f"http://brokeruser:{BROKER_PASSWORD}@{base}",
    }


@pytest.mark.slow
def test_status_enqueue_replay_relay_never_print_a_password(env, conn, http_sink):
    enqueue_n(conn, "outbox_orders", 3)
    # the broker refuses the first order for good and is down for the others, so status has a dead
    # letter and a failing destination (named by its URL) to show
    http_sink.script = lambda key, attempt, body: (400, {}, b'{"error": "bad"}') if key == "e0" else (503, {}, b"down")
    results = {
        "enqueue": run_cli(
            env,
            "enqueue",
            "--table",
            "outbox_events",
            "--topic",
            "org.changed",
            "--payload",
            '{"org_id": 1}',
            "--event-id",
            "s-1",
        ),
        "enqueue --json": run_cli(
            env,
            "enqueue",
            "--table",
            "outbox_events",
            "--topic",
            "org.changed",
            "--payload",
            '{"org_id": 1}',
            "--event-id",
            "s-1",
            "--json",
        ),
        "relay orders": run_cli(env, "relay", "--table", "outbox_orders", "--once"),
        "relay orders --json": run_cli(env, "relay", "--table", "outbox_orders", "--once", "--json"),
        "relay events -v": run_cli(env, "-v", "relay", "--table", "outbox_events", "--once"),
        "status": run_cli(env, "status"),
        "status --json": run_cli(env, "status", "--json"),
        "replay --dry-run": run_cli(env, "replay", "--table", "outbox_orders", "--all", "--dry-run"),
        "replay --dry-run --json": run_cli(env, "replay", "--table", "outbox_orders", "--all", "--dry-run", "--json"),
        "requeue-stuck": run_cli(env, "requeue-stuck"),
        "clean": run_cli(env, "clean"),
        "db upgrade": run_cli(env, "db", "upgrade"),
    }
    for what, result in results.items():
        assert result.returncode == 0, f"{what}: {result.stderr}"
        assert_no_secret(result, what=what)
    assert "sent 1" in results["relay events -v"].stdout
    assert http_sink.received, "the relay reached the broker"
    status = results["status"].stdout
    assert "dead by error code" in status and "have failed" in status, status  # there was something to print


def test_db_url_is_masked_unless_show_password(env, secret_url):
    masked = run_cli(env, "db", "url")
    assert masked.returncode == 0, masked.stderr
    assert_no_secret(masked, what="db url")
    assert masked.stdout.strip() == secret_url.replace(DB_PASSWORD, "***")
    shown = run_cli(env, "db", "url", "--show-password")
    assert shown.returncode == 0 and shown.stdout.strip() == secret_url


@pytest.mark.slow
def test_a_failing_connection_does_not_echo_the_password(env, secret_url):
    dbname = psycopg.conninfo.conninfo_to_dict(secret_url)["dbname"]
    host = psycopg.conninfo.conninfo_to_dict(secret_url)["host"]
    for url in (
        f"postgresql://someone:{DB_PASSWORD}@127.0.0.1:{free_port()}/{dbname}?connect_timeout=3",
        f"postgresql://no_such_role_here:{DB_PASSWORD}@/{dbname}?host={host}",
        f"host={host} dbname=no_such_db user=postgres password={DB_PASSWORD}",
    ):
        for command in (
            ["status"],
            ["db", "upgrade"],
            ["enqueue", "--table", "outbox_events", "--topic", "org.changed", "--payload", "{}"],
        ):
            result = run_cli({**env, "OUTBOX_DATABASE_URL": url}, *command)
            assert result.returncode == 1, f"{command} {url}: {result.stderr}"
            assert "cannot connect to PostgreSQL at" in result.stderr and "***" in result.stderr
            assert_no_secret(result, what=f"{command} on {url}")


MALFORMED = [
    f"postgresql://u:{DB_PASSWORD}@[::1",
    f"postgresql://u:{DB_PASSWORD}@host/db?bogus_option=1",
    f"postgresql://u:{DB_PASSWORD}%zz@host/db",
    f"postgresql+psycopg://u:{DB_PASSWORD}@[::1]:5432:9/db",
    f"host=h password={DB_PASSWORD} bogus=1",
]
COMMANDS = [
    ["status"],
    ["status", "--json"],
    ["db", "url"],
    ["db", "upgrade"],
    ["db", "create-table", "hrm_outbox"],
    ["enqueue", "--table", "outbox_events", "--topic", "org.changed", "--payload", "{}"],
    ["relay", "--table", "outbox_events", "--once"],
    ["replay", "--table", "outbox_events", "--all", "--dry-run"],
    ["requeue-stuck"],
    ["clean"],
    ["demo", "--quiet"],
    ["order-api", "--port", "0"],
]


# Every command reads the URL through one function (core/storage/db.py): each command is run with one malformed
# URL, and each shape of malformed URL with a command that opens a session, one that migrates and the relay.
SOME_COMMANDS = [["status"], ["db", "upgrade"], ["relay", "--table", "outbox_events", "--once"]]


@pytest.mark.parametrize(
    ("url", "every_command"),
    [(MALFORMED[0], True), *((url, False) for url in MALFORMED[1:])],
    ids=["ipv6-every-command", "bad-option", "bad-escape", "bad-port", "conninfo"],
)
@pytest.mark.slow
def test_a_malformed_database_url_is_exit_2_with_the_password_masked(cli_env, url, every_command):
    for command in [*COMMANDS, ["dev", "--port", str(free_port())]] if every_command else SOME_COMMANDS:
        result = run_cli({**cli_env, "OUTBOX_DATABASE_URL": url}, *command, timeout=60)
        assert result.returncode == 2, f"{command}: {result.returncode} {result.stderr}"
        assert "is not valid" in result.stderr and "***" in result.stderr, f"{command}: {result.stderr}"
        assert_no_secret(result, what=f"{command} on {url}")


def test_the_dagster_resource_fails_with_a_masked_config_error(monkeypatch):
    """What Dagster stores as a step's failure (message, stack, causes) holds no password."""
    # Imported here: only this test of the module needs Dagster (~0.8 s to import).
    from dagster._utils.error import serializable_error_info_from_exc_info

    from outbox_pipelines.defs.resources import OutboxDatabase

    monkeypatch.setenv(db.DATABASE_URL_ENV, MALFORMED[0])
    try:
        OutboxDatabase().database_url()
    except ConfigError as exc:
        assert isinstance(exc, InvalidDatabaseUrl)
        assert exc.__cause__ is None and exc.__context__ is None
        info = serializable_error_info_from_exc_info(sys.exc_info())
    else:
        pytest.fail("a malformed URL was accepted")
    assert "u:***@[::1" in info.message
    assert DB_PASSWORD not in info.to_string() and DB_PASSWORD not in json.dumps(info._asdict(), default=str)
    for build in (
        lambda: db.sqlalchemy_url(MALFORMED[0]),
        lambda: db.connect(MALFORMED[1]),
        lambda: db.url_with_database(MALFORMED[2], "x"),
    ):
        with pytest.raises(InvalidDatabaseUrl) as caught:
            build()
        assert DB_PASSWORD not in str(caught.value) and caught.value.__context__ is None


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql://u:pw@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://postgres:@/outbox?host=/tmp/x", "postgresql://postgres:@/outbox?host=/tmp/x"),
        ("postgresql:///db?host=/s&password=pw&user=u", "postgresql:///db?host=/s&password=***&user=u"),
        ("host=h password='p w' user=u", "host=h password=*** user=u"),
        ("postgresql://u:pw@[::1", "postgresql://u:***@[::1"),
    ],
)
def test_mask_url_of_database_urls(url, masked):
    assert db.mask_url(url) == masked


@pytest.mark.parametrize("password", ["S3cret?Pw-xyz", "S3cret/Pw-xyz", "S3cret#Pw-xyz", "S3c?re/t#Pw@xyz"])
@pytest.mark.slow
def test_a_password_with_a_raw_question_mark_or_slash_is_never_printed(cli_env, password):
    """Issue 22: with a raw "?" in the password the URL was printed in clear (libpq reads the rest as a query),
    and with "/" or "#" libpq's complaint quoted a piece of it ("the port 'S3cret'")."""
    pieces = [
        p
        for p in password.replace("?", " ").replace("/", " ").replace("#", " ").replace("@", " ").split()
        if len(p) >= 3
    ]
    url = f"postgresql://someone:{password}@127.0.0.1:{free_port()}/outbox?connect_timeout=3"
    for command in (["status"], ["db", "url"], ["db", "upgrade"]):
        result = run_cli({**cli_env, "OUTBOX_DATABASE_URL": url}, *command)
        # nothing listens there: every command but `db url` (which only prints it) fails
        assert result.returncode in ((0, 2) if command == ["db", "url"] else (1, 2)), f"{command}: {result.stderr}"
        assert "***" in result.stdout + result.stderr, result.stderr
        for secret in [password, *pieces]:
            assert secret not in result.stdout + result.stderr, f"{command}: {secret!r} in\n{result.stderr}"
    assert db.mask_url(url).startswith("postgresql://someone:***@127.0.0.1:")


@pytest.mark.parametrize(
    "url, masked",
    [
        ("postgresql://u:pa?ss@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa#ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa?ss@/db?host=/tmp/x", "postgresql://u:***@/db?host=/tmp/x"),
        ("postgresql://u:pw@h1:5432,h2:5433/db", "postgresql://u:***@h1:5432,h2:5433/db"),
        # a raw "@" after the host reads as the end of a user-info (over-masked; refused at load: issue 42)
        ("postgresql://u@h/db?application_name=a@b", "postgresql://***@b"),
    ],
)
def test_mask_url_of_unencoded_passwords(url, masked):
    assert db.mask_url(url) == masked


# A destination URL from the environment, mistyped or with a generated password holding "#", "?" or "/": a URL
# parser ends the user-info there, so the whole URL reached the settings error (and every command's stderr).
DESTINATION_URLS = [
    ("rabbitmq", "amqp://rmquser:Secret#HashR@127.0.0.1:5672/", "Secret#HashR"),
    ("rabbitmq", "amqp://rmquser:Secret?QR@127.0.0.1:5672/", "Secret?QR"),
    ("rabbitmq", "amqp://rmquser:Secret/SlashR@127.0.0.1:5672/", "Secret/SlashR"),
    ("rabbitmq", "rmquser:SecretNoSchemeR@127.0.0.1:5672/", "SecretNoSchemeR"),
    ("rabbitmq", "amqp:/rmquser:SecretOneSlashR@127.0.0.1", "SecretOneSlashR"),
    ("nats", "natsuser:SecretNoSchemeX@127.0.0.1:4222", "SecretNoSchemeX"),
    ("http", "https://hookuser:HttpPw#Hash1@hooks.example.com/in", "HttpPw#Hash1"),
    ("http", "https://hookuser:HttpPw?Q2@hooks.example.com/in", "HttpPw?Q2"),
]


@pytest.mark.parametrize("kind, url, password", DESTINATION_URLS)
def test_a_mistyped_destination_url_is_refused_with_its_password_masked(cli_env, tmp_path, kind, url, password):
    config = tmp_path / "outbox.toml"
    config.write_text(f'shipped_tables = false\n[tables.t_dest]\ndestination = "{kind}"\nurl_env = "T_DEST_URL"\n')
    env = {**cli_env, "OUTBOX_CONFIG": str(config), "T_DEST_URL": url}
    pieces = [p for p in password.replace("#", " ").replace("?", " ").replace("/", " ").split() if len(p) >= 3]
    for command in (["status"], ["status", "--json"], ["relay", "--table", "t_dest", "--once"]):
        result = run_cli(env, *command)
        said = result.stdout + result.stderr
        assert result.returncode == 2, f"{command}: {said}"
        assert "t_dest" in said and "***@" in said, f"{command}: {said}"
        for secret in [password, *pieces]:
            assert secret not in said, f"{command}: {secret!r} in\n{said}"
