"""Issue 9: the broker's credential is its own secret, sent only to destinations, and never shown.

- ``OUTBOX_BROKER_TOKEN`` is sent as ``Authorization: Bearer <token>`` to HTTP destinations (the
  order broker included); ``OUTBOX_API_TOKEN`` (the Order API's accepted tokens) never leaves.
- A destination URL with user-info is sent as Basic auth, the user-info taken out of the URL;
  together with a token it is refused at start-up with a ConfigError.
- The destination's name (logs, Dagster run logs, alerts) never holds a credential.

Real sockets: the http_sink records every request as it arrived.
"""

import base64
import logging
from urllib.parse import urlsplit

import pytest

from outbox_pipelines import Message, Outbox
from outbox_pipelines.core.destinations import HttpDestination
from outbox_pipelines.core.destinations.http.destination import TRANSPORTS
from outbox_pipelines.core.destinations.wiring import build_destination
from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.relay import run_table_relay
from outbox_pipelines.core.settings import GlobalSettings, load_settings
from outbox_pipelines.orders.broker import OrderBroker
from outbox_pipelines_tests.core.destinations.http.test_http import claimed
from outbox_pipelines_tests.helpers import accept_order, order_payload, rows
from outbox_pipelines_tests.scratch import DEMO_PARTS

PASSWORD = "brokerpass-9f3"
API_TOKENS = "api-caller-a,api-caller-b"


def header(received, name: str) -> str | None:
    values = [v for k, v in received.headers.items() if k.lower() == name.lower()]
    assert len(values) <= 1, f"{name} sent {len(values)} times"
    return values[0] if values else None


def with_userinfo(url: str, user: str = "brokeruser", password: str = PASSWORD) -> str:
    return url.replace("http://", f"http://{user}:{password}@", 1)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


# -- the variables ----------------------------------------------------------------------------------


def test_the_broker_token_is_its_own_variable():
    env = GlobalSettings.from_env({"OUTBOX_API_TOKEN": API_TOKENS, "OUTBOX_BROKER_TOKEN": "brk-token"})
    assert env.broker_token == "brk-token"
    assert API_TOKENS not in repr(env)  # the engine does not read the Order API's tokens at all
    assert GlobalSettings.from_env({"OUTBOX_API_TOKEN": API_TOKENS}).broker_token is None
    assert GlobalSettings.from_env({"OUTBOX_BROKER_TOKEN": " brk-token\n"}).broker_token == "brk-token"


@pytest.mark.parametrize("token", ["two words", "tok\r\nX-Evil: 1", "tök", "tab\there"])
def test_a_token_that_cannot_travel_in_a_header_is_refused_at_start_up(token):
    with pytest.raises(ConfigError, match="OUTBOX_BROKER_TOKEN") as refused:
        load_settings(env={"OUTBOX_BROKER_TOKEN": token, "OUTBOX_BROKER_URL": "http://127.0.0.1:1/orders"}, path=None)
    assert token not in str(refused.value)


@pytest.mark.parametrize("table", ["outbox_orders", "outbox_hooks"])
def test_the_broker_token_is_sent_and_the_api_tokens_never(tmp_path, http_sink, table):
    config = tmp_path / "outbox.toml"
    config.write_text(f'{DEMO_PARTS}[tables.outbox_hooks]\ndestination = "http"\nurl = "{http_sink.url}/hooks"\n')
    env = {"OUTBOX_API_TOKEN": API_TOKENS, "OUTBOX_BROKER_TOKEN": "brk-token", "OUTBOX_BROKER_URL": http_sink.url}
    settings = load_settings(env=env, path=config)
    destination = build_destination(settings.table(table), settings)
    try:
        payload = order_payload(1, "k-1") if table == "outbox_orders" else {"a": 1}
        [outcome] = destination.deliver([claimed("k-1", payload=payload)])
    finally:
        destination.close()
    assert outcome.kind == "sent", outcome
    [received] = http_sink.received
    assert header(received, "Authorization") == "Bearer brk-token"
    assert not any("api-caller" in v for v in received.headers.values())


def test_without_a_broker_token_no_credential_is_sent_even_with_api_tokens(http_sink):
    settings = load_settings(env={"OUTBOX_API_TOKEN": API_TOKENS, "OUTBOX_BROKER_URL": http_sink.url}, path=None)
    destination = build_destination(settings.table("outbox_orders"), settings)
    try:
        [outcome] = destination.deliver([claimed("k-2", payload=order_payload(2, "k-2"))])
    finally:
        destination.close()
    assert outcome.kind == "sent", outcome
    [received] = http_sink.received
    assert header(received, "Authorization") is None


# -- user-info in the URL ---------------------------------------------------------------------------


def test_user_info_and_a_token_together_are_refused_at_start_up(tmp_path):
    url = with_userinfo("http://127.0.0.1:1/orders")
    with pytest.raises(ConfigError) as refused:
        load_settings(env={"OUTBOX_BROKER_URL": url, "OUTBOX_BROKER_TOKEN": "brk-token"}, path=None).check()
    message = str(refused.value)
    assert "OUTBOX_BROKER_URL" in message and "OUTBOX_BROKER_TOKEN" in message
    assert "http://***@127.0.0.1:1/orders" in message
    assert PASSWORD not in message and "brokeruser" not in message and "brk-token" not in message

    config = tmp_path / "outbox.toml"
    config.write_text(
        f'[tables.outbox_hooks]\ndestination = "http"\nurl = "{url}"\ntoken_env = "OUTBOX_BROKER_TOKEN"\n'
    )
    with pytest.raises(ConfigError, match=r"\[tables.outbox_hooks\] url") as refused:
        load_settings(env={"OUTBOX_BROKER_TOKEN": "brk-token"}, path=config).check()
    assert PASSWORD not in str(refused.value)
    # Not at the broker's origin and not named by the table: the broker's token is not this table's, so
    # its user-info alone is its credential.
    config.write_text('[tables.outbox_hooks]\ndestination = "http"\nurl_env = "HOOKS_URL"\n')
    environ = {"OUTBOX_BROKER_TOKEN": "brk-token", "HOOKS_URL": url}
    assert load_settings(env=environ, path=config).table("outbox_hooks").token is None

    # Built by hand, the destination refuses it the same way.
    with pytest.raises(ConfigError) as refused:
        HttpDestination(url, token="brk-token")
    assert PASSWORD not in str(refused.value)
    with pytest.raises(ConfigError):
        OrderBroker(url, token="brk-token")


def test_user_info_alone_is_loaded():
    settings = load_settings(env={"OUTBOX_BROKER_URL": with_userinfo("http://127.0.0.1:1/orders")}, path=None)
    assert settings.table("outbox_orders").url.startswith("http://brokeruser:")


@pytest.mark.parametrize(
    "bad", ["http://u:p@127.0.0.1:99999/orders", "ftp://u:p@broker/orders", "http://u:p@[::1/orders"]
)
def test_an_unusable_broker_url_is_refused_at_start_up_without_its_password(bad):
    with pytest.raises(ConfigError, match="OUTBOX_BROKER_URL") as refused:
        load_settings(env={"OUTBOX_BROKER_URL": bad}, path=None).check()
    assert ":p@" not in str(refused.value)


def test_user_info_is_sent_as_basic_auth_and_never_in_the_url(http_sink, transport):
    url = with_userinfo(http_sink.url + "/orders", "svc@corp", "p:ss/w%rd")
    url = url.replace("svc@corp", "svc%40corp").replace("p:ss/w%rd", "p%3Ass%2Fw%25rd")
    destination = HttpDestination(url, transport=transport)
    try:
        assert PASSWORD not in destination.name and "p%3Ass" not in destination.name and "svc" not in destination.name
        assert urlsplit(destination.url).username is None
        [outcome] = destination.deliver([claimed("k-basic")])
    finally:
        destination.close()
    assert outcome.kind == "sent", outcome
    [received] = http_sink.received
    assert header(received, "Authorization") == basic("svc@corp", "p:ss/w%rd")


def test_the_order_broker_with_user_info_sends_basic_auth_and_names_itself_without_it(http_sink):
    broker = OrderBroker(with_userinfo(http_sink.url + "/orders"))
    try:
        assert broker.name == f"order broker {http_sink.url.rstrip('/')}"  # the origin: no user-info, no path
        [outcome] = broker.deliver([claimed("k-ob", payload=order_payload(3, "k-ob"))])
    finally:
        broker.close()
    assert outcome.kind == "sent", outcome
    [received] = http_sink.received
    assert header(received, "Authorization") == basic("brokeruser", PASSWORD)


@pytest.mark.parametrize("name", [None, "{url}", "order broker {url}"])
def test_a_destination_name_never_holds_the_credentials(name):
    url = with_userinfo("http://127.0.0.1:1/orders")
    destination = HttpDestination(url, name=name.format(url=url) if name else None)
    try:
        assert PASSWORD not in destination.name and "brokeruser" not in destination.name
        assert destination.name.endswith("http://127.0.0.1:1")  # the origin only (issue 22: paths hold secrets too)
    finally:
        destination.close()


def test_a_relay_to_a_broker_with_user_info_shows_no_credential_anywhere(db_url, conn, http_sink, caplog):
    """The relay's logs, report and stored rows (what the CLI and Dagster show) hold no password."""
    http_sink.script = lambda key, attempt, body: (503, {}, b"busy") if key == "k-retry" else None
    settings = load_settings(env={"OUTBOX_BROKER_URL": with_userinfo(http_sink.url + "/orders")}, path=None)
    with conn.transaction():
        accept_order(conn, "", order_payload(1, "k-sent"))
        accept_order(conn, "", order_payload(2, "k-retry"))
    Outbox("outbox_orders").enqueue(
        conn, Message(topic="order.submitted", payload={"not": "an order"}, event_id="k-bad"), outside_transaction=True
    )
    caplog.set_level(logging.DEBUG)
    report = run_table_relay(db_url, settings, "outbox_orders", once=True)
    assert (report.sent, report.retried, report.dead) == (1, 1, 1), report

    stored = rows(conn, "outbox_orders") + conn.execute("SELECT * FROM outbox_audit").fetchall()
    stored += conn.execute("SELECT * FROM idempo_ledger").fetchall()
    for text in (caplog.text, str(report.as_dict()), str(stored)):
        assert PASSWORD not in text and "brokeruser" not in text
    assert all(header(r, "Authorization") == basic("brokeruser", PASSWORD) for r in http_sink.received)
    assert {r.key for r in http_sink.received} == {"k-sent", "k-retry"}
