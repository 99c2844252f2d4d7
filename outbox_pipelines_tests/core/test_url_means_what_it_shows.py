"""A URL means what it shows (issue 42, point 4).

A password holding a raw "@", "#", "?" or "/" made a URL read two ways: the mask showed one host and the client
used another (``Zq@7x/Kp9``: libpq asked DNS for the host ``7x`` and its error quoted 8 of 10 characters; httpx
sent the message, with half the password as Basic auth, to the host before the password's "@"). Such a URL is
refused where it is loaded, with "percent-encode the password", naming the setting that holds it and showing
none of the password; a percent-encoded one works, end to end; and one function masks every URL and host list.
"""

import base64
import logging
import re
import sys
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines.core import redaction
from outbox_pipelines.core.errors import ConfigError, InvalidDatabaseUrl
from outbox_pipelines.core.redaction import mask_url, redact_text
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.storage import db
from outbox_pipelines_tests import postgres_majors
from outbox_pipelines_tests.conftest import REPO, run_cli
from outbox_pipelines_tests.helpers import enqueue_n, free_port
from outbox_pipelines_tests.sink import HttpSink

REFUSED = "percent-encode the password"
# Passwords a generator makes: each holds raw URL delimiters, none shares 3 characters in a row with what the
# messages say (so any 3 of them in a row in an output is a leak).
PASSWORDS = ["Zq@7x/Kp9", "Vw#4k?Rn8", "Tb/9m@Hd#2?", "Yg?3f#Lc@6w", "Jx@Qe@Wz5"]


def pieces(password: str) -> set[str]:
    return {password[i : i + 3] for i in range(len(password) - 2)}


def assert_none_of(password: str, text: str, what: str) -> None:
    shown = sorted(piece for piece in pieces(password) if piece in text)
    assert not shown, f"{what}: {shown} of the password in:\n{text}"


# -- one masking rule --------------------------------------------------------------------------------------

MASKED = [
    # a raw "@", "/", "#" in the password: the whole password hidden, the real host shown
    ("postgresql://app:Zq@7x/Kp9@db.internal:5432/outbox", "postgresql://app:***@db.internal:5432/outbox"),
    ("postgresql://app:Vw#4k?Rn8@db.internal/outbox", "postgresql://app:***@db.internal/outbox"),
    # a raw "@" after the host: read as a password's (over-masked, and refused at load)
    ("postgresql://app:pw123456@db/outbox?application_name=a@b", "postgresql://app:***@b"),
    # no password; an empty one
    ("postgresql://app@db.internal/outbox", "postgresql://app@db.internal/outbox"),
    ("postgresql://app:@db.internal/outbox", "postgresql://app:@db.internal/outbox"),
    # IPv6 hosts, several hosts, a Unix socket
    ("postgresql://app:pw123456@[2001:db8::1]:5432/outbox", "postgresql://app:***@[2001:db8::1]:5432/outbox"),
    ("postgresql://app:pw123456@h1:5432,h2:5432/outbox", "postgresql://app:***@h1:5432,h2:5432/outbox"),
    ("postgresql://app:pw123456@/outbox?host=/run/pg", "postgresql://app:***@/outbox?host=/run/pg"),
    # password= in the query, in a conninfo
    (
        "postgresql:///outbox?host=/run/pg&password=pw123456&user=app",
        "postgresql:///outbox?host=/run/pg&password=***&user=app",
    ),
    ("host=db user=app password='p w@x/y'", "host=db user=app password=***"),
    # Kafka's bootstrap servers with a credential pasted in
    ("h1:9092,alice:pw123456@h2:9092", "***@h2:9092"),
    ("SASL_SSL://alice:pw123456@h1:9092,h2:9092", "SASL_SSL://***@h1:9092,h2:9092"),
    # AMQP and NATS credentials (a NATS token is a bare user-info), HTTP
    ("amqp://rabbit:pw123456@[::1]:5672/vhost", "amqp://***@[::1]:5672/vhost"),
    ("amqps://rabbit:Zq@7x#Kp9@mq.example.com/", "amqps://***@mq.example.com/"),
    ("nats://natsuser:pw123456@nats.example.com:4222", "nats://***@nats.example.com:4222"),
    ("nats://s3cr3ttoken@nats.example.com:4222", "nats://***@nats.example.com:4222"),
    ("https://hook:Zq@7x#Kp9@hooks.example.com/in", "https://***@hooks.example.com/in"),
    ("https://hooks.example.com/in?api_key=pw123456&x=1", "https://hooks.example.com/in?api_key=***&x=1"),
    ("https://hooks.example.com/in", "https://hooks.example.com/in"),
]


@pytest.mark.parametrize("url, masked", MASKED)
def test_one_rule_masks_every_url_and_host_list(url, masked):
    assert mask_url(url) == masked
    # a URL (or a conninfo) quoted in free text (an error, a name) is masked the same way; a bare host list is not
    # a URL there: Kafka's is refused where it is read (below)
    if "://" in url or "password=" in url:
        assert redact_text(f"cannot reach '{url}': refused") == f"cannot reach '{masked}': refused"


def test_the_masking_rule_is_the_only_one():
    """One function masks URLs (redaction.mask_url); the database module's own mask and the old redact_url are
    gone, and no other module parses a user-info by hand (splitting at an "@")."""
    package = REPO / "outbox_pipelines"
    own = package / "core" / "redaction.py"
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        for pattern in (
            r"def (mask|redact)\w*\(",  # a masking function of its own
            r"\b(mask_password|redact_url|_userinfo_span|_PASSWORD_PARAM|_USERINFO)\b",  # the old ones
            r"""(r?split|r?partition|r?find|r?index)\(\s*["']@["']""",  # a user-info read by hand
        ):
            if path != own and re.search(pattern, text):
                found.append(f"{path.relative_to(REPO)}: {pattern}")
    assert not found, found
    assert not hasattr(db, "mask_password") and not hasattr(db, "redact")
    assert not hasattr(redaction, "redact_url")
    assert db.mask_url is mask_url


# -- refused at load, in every process, without a piece of the password ------------------------------------


def two_way_url(scheme: str, password: str, host: str = "127.0.0.1:5432", path: str = "/outbox") -> str:
    return f"{scheme}://app:{password}@{host}{path}"


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_database_url_that_reads_two_ways_is_refused_in_process(password, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    url = two_way_url("postgresql", password)
    monkeypatch.setenv(db.DATABASE_URL_ENV, url)
    for build in (
        lambda: db.parse_url(url),
        lambda: db.connect(url),
        lambda: db.sqlalchemy_url(url),
        lambda: db.url_with_database(url, "x"),
        lambda: db.resolve_database(announce=False),
    ):
        with pytest.raises(InvalidDatabaseUrl) as refused:
            build()
        message = str(refused.value)
        assert REFUSED in message and "OUTBOX_DATABASE_URL" in message, message
        assert "postgresql://app:***@127.0.0.1:5432/outbox" in message  # the host libpq would not have used
        assert refused.value.__context__ is None and refused.value.__cause__ is None
        assert_none_of(password, message, "the exception")
    monkeypatch.delenv(db.DATABASE_URL_ENV)
    with pytest.raises(InvalidDatabaseUrl, match="passed in code") as refused:
        db.connect(url)  # not from a variable: the message says so
    assert_none_of(password, str(refused.value) + caplog.text, "connect from code, and the logs")


def test_the_dagster_resource_refuses_it_and_stores_no_piece_of_it():
    from dagster._utils.error import serializable_error_info_from_exc_info

    from outbox_pipelines.defs.resources import OutboxDatabase

    password = PASSWORDS[0]
    try:
        OutboxDatabase(url=two_way_url("postgresql", password)).engine()
    except InvalidDatabaseUrl:
        info = serializable_error_info_from_exc_info(sys.exc_info())
    else:
        pytest.fail("a URL that reads two ways was accepted")
    assert REFUSED in info.message
    assert_none_of(password, info.to_string(), "Dagster's error info")


DESTINATIONS = {
    "http": ("https", "hooks.example.com", "/in"),
    "nats": ("nats", "nats.example.com:4222", ""),
    "rabbitmq": ("amqp", "mq.example.com:5672", "/"),
}


@pytest.mark.parametrize("kind", sorted(DESTINATIONS))
@pytest.mark.parametrize("password", PASSWORDS)
def test_a_destination_url_that_reads_two_ways_is_refused_at_load(kind, password, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    scheme, host, path = DESTINATIONS[kind]
    url = two_way_url(scheme, password, host, path)
    config = tmp_path / "outbox.toml"
    config.write_text(f'shipped_tables = false\n[tables.t_dest]\ndestination = "{kind}"\nurl_env = "T_DEST_URL"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(env={"T_DEST_URL": url}, path=config).check()
    message = str(refused.value)
    assert REFUSED in message and "T_DEST_URL ([tables.t_dest] url_env)" in message, message
    assert f"{scheme}://***@{host}{path}" in message
    assert_none_of(password, message + caplog.text, f"{kind} settings")
    # built by hand, the destination refuses it the same way
    with pytest.raises(ConfigError, match=REFUSED) as refused:
        build_by_hand(kind, url)
    assert_none_of(password, str(refused.value), f"{kind} built by hand")


def build_by_hand(kind: str, url: str) -> object:
    if kind == "http":
        from outbox_pipelines.core.destinations.http.destination import HttpDestination

        return HttpDestination(url)
    if kind == "nats":
        from outbox_pipelines.core.destinations.nats.jetstream import NatsJetStreamDestination

        return NatsJetStreamDestination(url)
    from outbox_pipelines.core.destinations.rabbitmq.destination import RabbitMQDestination

    return RabbitMQDestination(url, exchange="x")


@pytest.mark.parametrize(
    "servers", ["alice:{pw}@k1:9092", "k1:9092,alice:{pw}@k2:9092", "SASL_SSL://alice:{pw}@k1:9092"]
)
def test_kafka_bootstrap_servers_holding_a_credential_are_refused_masked(servers, tmp_path):
    from outbox_pipelines.core.destinations.kafka.destination import KafkaDestination

    password = "Hq7Lm2Xv9"  # as pasted from a console: no delimiter, still never shown
    servers = servers.format(pw=password)
    config = tmp_path / "outbox.toml"
    config.write_text(
        f'shipped_tables = false\n[tables.t_kafka]\ndestination = "kafka"\nbootstrap_servers = "{servers}"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(env={}, path=config).check()
    assert "sasl_username and sasl_password_env" in str(refused.value)
    assert_none_of(password, str(refused.value), "kafka settings")
    with pytest.raises(ConfigError) as refused:
        KafkaDestination(servers)
    assert_none_of(password, str(refused.value), "KafkaDestination")


# -- the real CLI ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("password", PASSWORDS)
def test_the_cli_refuses_a_database_url_that_reads_two_ways(cli_env, password):
    env = {**cli_env, "OUTBOX_DATABASE_URL": two_way_url("postgresql", password, f"127.0.0.1:{free_port()}")}
    for command in (["status"], ["db", "url"]):
        result = run_cli(env, *command)
        said = result.stdout + result.stderr
        assert result.returncode == 2, f"{command}: {said}"
        assert REFUSED in said and "OUTBOX_DATABASE_URL" in said and "Traceback" not in said, said
        assert_none_of(password, said, f"{command}")


@pytest.mark.parametrize(
    "kind, host, password",
    [
        ("http", "hooks.example.com/in", PASSWORDS[0]),
        ("nats", "nats.example.com:4222", PASSWORDS[1]),
        ("rabbitmq", "mq.example.com:5672/", PASSWORDS[2]),
        ("kafka", "k1:9092", "Hq7Lm2Xv9"),
    ],
)
def test_the_cli_refuses_a_destination_url_that_reads_two_ways(cli_env, tmp_path, kind, host, password):
    scheme = {"http": "https://", "nats": "nats://", "rabbitmq": "amqp://", "kafka": ""}[kind]
    config = tmp_path / "outbox.toml"
    config.write_text(f'shipped_tables = false\n[tables.t_dest]\ndestination = "{kind}"\nurl_env = "T_DEST_URL"\n')
    env = {**cli_env, "OUTBOX_CONFIG": str(config), "T_DEST_URL": f"{scheme}app:{password}@{host}"}
    for command in (["status"], ["relay", "--table", "t_dest", "--once"]):
        result = run_cli(env, *command)
        said = result.stdout + result.stderr
        assert result.returncode == 2, f"{command}: {said}"
        assert "t_dest" in said and (REFUSED if kind != "kafka" else "sasl_username") in said, said
        assert "Traceback" not in said
        assert_none_of(password, said, f"{kind} {command}")


def test_an_http_url_that_reads_two_ways_sends_nothing_anywhere(cli_env, conn):
    """Before: the mask showed the second receiver, httpx sent the message to the first with ``hook:Zq`` as Basic
    auth. Now the table is refused at load and neither receiver gets anything."""
    first, second = HttpSink().start(), HttpSink().start()
    try:
        a, b = (sink.url.split("://", 1)[1].rstrip("/") for sink in (first, second))
        password = f"Zq@{a}/Kp9#x"  # what the operator meant: user hook, this password, host b
        url = f"http://hook:{password}@{b}/orders"
        enqueue_n(conn, "outbox_orders", 1)
        result = run_cli({**cli_env, "OUTBOX_BROKER_URL": url}, "relay", "--table", "outbox_orders", "--once")
        said = result.stdout + result.stderr
        assert result.returncode == 2 and REFUSED in said and "OUTBOX_BROKER_URL" in said, said
        assert not first.received and not second.received
        for piece in ("Zq@", "Kp9", "#x@", a):
            assert piece not in said, f"{piece!r} in {said}"
    finally:
        first.stop()
        second.stop()


def test_an_alert_webhook_url_that_reads_two_ways_posts_nothing(caplog):
    from outbox_pipelines.core.oncall.alerts import post_alert

    first, second = HttpSink().start(), HttpSink().start()
    try:
        a, b = (sink.url.split("://", 1)[1].rstrip("/") for sink in (first, second))
        assert post_alert({"text": "disk full"}, url=f"http://hook:Zq@{a}/Kp9#x@{b}/alerts") is False
        assert not first.received and not second.received
    finally:
        first.stop()
        second.stop()
    assert REFUSED in caplog.text and "OUTBOX_ALERT_WEBHOOK_URL" in caplog.text
    assert "Zq@" not in caplog.text and "Kp9" not in caplog.text


def test_a_percent_encoded_password_is_sent_whole_to_the_host_shown(cli_env, conn, http_sink):
    password = "Zq@7x/Kp9#w?M"
    url = f"http://hook:{quote(password, safe='')}@{http_sink.url.split('://', 1)[1].rstrip('/')}/orders"
    enqueue_n(conn, "outbox_orders", 1)
    result = run_cli({**cli_env, "OUTBOX_BROKER_URL": url}, "relay", "--table", "outbox_orders", "--once")
    assert result.returncode == 0, result.stderr
    assert_none_of(password, result.stdout + result.stderr, "relay")
    [received] = http_sink.received
    auth = {k.lower(): v for k, v in received.headers.items()}["authorization"]
    assert auth == "Basic " + base64.b64encode(f"hook:{password}".encode()).decode()


# -- a percent-encoded database password, end to end, on a server that checks it ------------------------------

DB_PASSWORD = "Zq@7x/Kp9#w?M"


@pytest.fixture(scope="module")
def password_server():
    """A PostgreSQL of its own whose TCP logins need their password (scram-sha-256): the suite's server trusts
    its socket, where a password read wrong would pass unnoticed. A login whose password holds @ # ? /."""
    server = postgres_majors.start(18)
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE ROLE obx_delims LOGIN CREATEDB PASSWORD {}").format(sql.Literal(DB_PASSWORD)))
            admin.execute("CREATE DATABASE obx_delims OWNER obx_delims")
        yield server
    finally:
        server.stop()


def test_a_percent_encoded_database_password_connects(password_server, cli_env, tmp_path):
    port = password_server.port
    encoded = f"postgresql://obx_delims:{quote(DB_PASSWORD, safe='')}@127.0.0.1:{port}/obx_delims"
    with db.connect(encoded) as conn:
        assert conn.execute("SELECT current_user AS u").fetchone()["u"] == "obx_delims"
    assert db.mask_url(encoded) == f"postgresql://obx_delims:***@127.0.0.1:{port}/obx_delims"
    env = {**cli_env, "OUTBOX_DATABASE_URL": encoded}
    upgrade = run_cli(env, "db", "upgrade", timeout=120)
    status = run_cli(env, "status")
    shown = run_cli(env, "db", "url")
    for what, result in (("db upgrade", upgrade), ("status", status), ("db url", shown)):
        assert result.returncode == 0, f"{what}: {result.stderr}"
        assert_none_of(DB_PASSWORD, result.stdout + result.stderr, what)
    assert shown.stdout.strip() == f"postgresql://obx_delims:***@127.0.0.1:{port}/obx_delims"
    # the password is checked: one character off, and the server refuses (the message quotes none of it)
    wrong = encoded.replace(quote(DB_PASSWORD, safe="")[:4], "Zq%41")
    refused = run_cli({**env, "OUTBOX_DATABASE_URL": wrong}, "status")
    assert refused.returncode == 1 and "password authentication failed" in refused.stderr, refused.stderr
    assert_none_of(DB_PASSWORD, refused.stdout + refused.stderr, "wrong password")
    # written raw, it is refused before libpq reads a host out of it
    raw = run_cli({**env, "OUTBOX_DATABASE_URL": encoded.replace(quote(DB_PASSWORD, safe=""), DB_PASSWORD)}, "status")
    assert raw.returncode == 2 and REFUSED in raw.stderr, raw.stderr
    assert_none_of(DB_PASSWORD, raw.stdout + raw.stderr, "raw password")


def test_a_libpq_message_quoting_the_password_is_not_shown():
    """Defence in depth: whatever libpq quotes of the URL's password is masked, and an unquoted piece withholds
    its message (a URL that gets this far is one libpq parses, so only its own wording can quote it)."""
    url = "postgresql://app:Qz%3Fsecret9@h/db"
    assert db.scrub('invalid integer value "Qz?sec" for connection option "port"', url) == (
        'invalid integer value "***" for connection option "port"'
    )
    assert "secret9" not in db.scrub("could not translate host name secret9 to address", url)
    # a message quoting the URL names it, without repeating it
    assert db.scrub(f'missing "=" after "{url}" in connection info string', url) == (
        'missing "=" after the URL in connection info string'
    )
    assert (
        db.scrub('could not translate host name "h" to address', url) == 'could not translate host name "h" to address'
    )


def test_the_server_s_wrong_password_message_is_shown_whatever_the_password_spells():
    """A password holding "assw" or "word", as "Passw0rd" does: the message's own word "password" is no piece of it,
    so the most common login error is shown, not withheld; a piece outside the message's words still is."""
    url = "postgresql://appuser:S3cretPassw0rd!@/shop?host=/tmp/x"
    told = (
        'connection to server on socket "/tmp/x/.s.PGSQL.5432" failed: FATAL:  password authentication failed '
        'for user "appuser"'
    )
    assert db.scrub(told, url) == told
    encoded = "postgresql://appuser:auth%40word1@/shop?host=/tmp/x"
    assert db.scrub(told, encoded) == told
    assert "tPassw0" not in db.scrub("could not translate host name S3cretPassw0 to address", url)
