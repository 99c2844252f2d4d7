"""The on-call page as an engineer uses it: every table on one page, failing first; a table's dead and blocked
messages with their errors (no secret shown); a search by event id, key or tenant across tables; actions taken
only from the page's own forms, and a sentence saying what to do when the Dagster UI does not answer."""

from dataclasses import replace
from datetime import timedelta

import httpx
import pytest

from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.oncall_page import serve_in_thread
from outbox_pipelines_tests.helpers import db_now
from outbox_pipelines_tests.processes import free_port
from outbox_pipelines_tests.rows import make_dead

EVENTS = "outbox_events"
SECRET = "s3cr3t-hunter2"


def enqueue(conn, table, *messages):
    outbox = Outbox(table)
    return {
        event_id: outbox.enqueue(
            conn,
            Message(topic="org.changed", payload={"e": event_id}, event_id=event_id, ordering_key=key, tenant_id=t),
            outside_transaction=True,
        ).id
        for event_id, key, t in messages
    }


@pytest.fixture
def settings():
    shipped = load_settings(env={}, path=None)
    tables = dict(shipped.tables)
    tables["outbox_memory"] = replace(tables["outbox_memory"], paused_topics=("audit.exported",))
    return replace(shipped, tables=tables)


@pytest.fixture
def scene(conn):
    ids = enqueue(
        conn,
        EVENTS,
        ("evt-head", "org-7", "acme"),
        ("evt-next", "org-7", "acme"),
        ("evt-lone", None, "globex"),
        ("evt-ok", None, "acme"),
    )
    now = db_now(conn)
    make_dead(
        conn,
        EVENTS,
        ids["evt-head"],
        code="BAD_REQUEST",
        error="HTTP 422: field 'org' missing",
        attempts=1,
        at=now - timedelta(minutes=30),
    )
    make_dead(
        conn,
        EVENTS,
        ids["evt-lone"],
        code="UNAUTHORIZED",
        attempts=3,
        at=now - timedelta(minutes=5),
        error=f"HTTP 401 from https://bot:{SECRET}@hooks.example.com/x?api_key={SECRET}",
    )
    return ids


@pytest.fixture
def client(db_url, settings):
    """The page served by uvicorn on a free port, as ``dev`` serves it; its Dagster UI address answers nothing."""
    closed = f"http://127.0.0.1:{free_port()}"
    running = serve_in_thread("127.0.0.1", 0, database_url=db_url, settings=settings, ui_url=closed)
    with httpx.Client(base_url=running.url, timeout=30) as c:
        yield c
    running.stop()


def test_the_landing_page_has_every_table_failing_first_with_its_counts(client, scene):
    page = client.get("/")
    assert page.status_code == 200
    text = page.text
    order = [text.index(f'href="/tables/{name}"') for name in (EVENTS, "outbox_members", "outbox_memory")]
    assert order[0] < order[1] and order[0] < order[2]  # the unhealthy table leads
    row = text[text.index(f'href="/tables/{EVENTS}"') - 200 : text.index(f'href="/tables/{EVENTS}"') + 1500]
    assert "warning" in row or "failing" in row
    assert "1 (1 waiting)" in row  # one blocked key, one message behind it
    assert "dead_letters" in row or "blocked_keys" in row
    assert 'href="http://127.0.0.1:' in row and "/assets/outbox/outbox_events" in row  # its Dagster page
    assert "audit.exported" in text  # the paused topic is shown
    assert SECRET not in text


@pytest.fixture
def paused_message(conn):
    """A message of the topic outbox_memory's settings pause: it waits, and is not lag."""
    Outbox("outbox_memory").enqueue(
        conn, Message(topic="audit.exported", payload={}, event_id="evt-paused"), outside_transaction=True
    )


def test_paused_topics_are_shown_on_the_landing_page_and_the_tables_page(client, scene, paused_message):
    text = client.get("/").text
    link = text.index('href="/tables/outbox_memory"')
    row = text[link : text.index("</tr>", link)]
    assert "audit.exported (1 waiting)" in row
    table = client.get("/tables/outbox_memory").text
    paused = table.split("Paused on purpose", 1)[1].split("<h2>", 1)[0]
    assert "(1 topic; 1 message waiting)" in paused
    assert "audit.exported" in paused and "the table&#x27;s settings (paused_topics)" in paused
    assert "not lag" in paused and "paused_topics" in paused  # and how to resume it
    assert "Paused on purpose" not in client.get(f"/tables/{EVENTS}").text  # nothing paused there


def test_each_table_is_read_once_for_its_figures_and_its_verdicts(db_url, settings, scene, monkeypatch):
    """The line's figures and its health come from one snapshot of the table (what the checks grade is what the
    page shows), not two reads that may disagree."""
    from outbox_pipelines.core.storage.table import OutboxTable
    from outbox_pipelines.oncall_page import reads

    read = OutboxTable.health_snapshot
    seen: list[str] = []

    def counted(self, **kwargs):
        seen.append(self.table_name)
        return read(self, **kwargs)

    monkeypatch.setattr(OutboxTable, "health_snapshot", counted)
    lines = reads.overview(db_url, settings)
    assert sorted(seen) == sorted(line.name for line in lines) == reads.declared_tables(settings)
    [events] = [line for line in lines if line.name == EVENTS]
    assert events.counts["dead"] == 2 and events.health == "warning"


def test_a_table_page_lists_dead_and_blocked_messages_newest_first_with_actions(client, scene):
    text = client.get(f"/tables/{EVENTS}").text
    blocked, dead = text.split("Blocked ordering keys", 1)[1].split("Dead messages", 1)
    assert "evt-head" in blocked and "org-7" in blocked and "HTTP 422: field &#x27;org&#x27; missing" in blocked
    assert dead.index("evt-lone") < dead.index("evt-head")  # newest death first
    assert "UNAUTHORIZED" in dead and "hooks.example.com" in dead and SECRET not in text
    assert blocked.count("Replay…") == 1 and blocked.count("Skip…") == 1
    # The unkeyed dead message can be replayed; there is no key to skip it from.
    lone = dead[dead.index("evt-lone") : dead.index("</tr>", dead.index("evt-lone"))]
    assert "Replay…" in lone and "Skip…" not in lone
    assert client.get("/tables/not_declared").status_code == 404


def test_search_finds_by_event_id_key_or_tenant_in_any_table(client, scene):
    assert "evt-ok" in client.get("/search", params={"q": "evt-ok"}).text  # pending, found by its event id
    by_key = client.get("/search", params={"q": "org-7"}).text
    assert "evt-head" in by_key and "evt-next" in by_key and "evt-lone" not in by_key
    by_tenant = client.get("/search", params={"q": "globex"}).text
    assert "evt-lone" in by_tenant and "evt-head" not in by_tenant
    nothing = client.get("/search", params={"q": "<script>alert(1)</script>"}).text
    assert "<script>alert" not in nothing and "&lt;script&gt;" in nothing and "none" in nothing


def test_an_action_comes_only_from_the_page_and_says_when_dagster_does_not_answer(client, scene):
    form = {"table": EVENTS, "event_id": "evt-lone"}
    # Another site's form (or none at all) is refused before anything is read.
    assert client.post("/actions/replay", data=form).status_code == 403
    assert client.post("/actions/replay", data=form, headers={"Origin": "http://evil.example"}).status_code == 403
    same = {"Origin": str(client.base_url).rstrip("/")}
    # No Dagster UI where it points: one sentence with what to do, nothing launched.
    answer = client.post("/actions/replay", data=form, headers=same)
    assert answer.status_code == 503
    assert "does not answer" in answer.text and "outbox-pipelines dev" in answer.text and "OUTBOX_UI_URL" in answer.text
    # A skip names a dead head of a key; a real run needs a reason.
    assert client.post("/actions/skip", data=form, headers=same).status_code == 404
    real = {"table": EVENTS, "event_id": "evt-head", "real": "1", "reason": ""}
    assert "reason is needed" in client.post("/actions/skip", data=real, headers=same).text
    assert client.post("/actions/explode", data=form, headers=same).status_code == 404


def test_in_a_container_it_links_to_the_browsers_address_and_launches_through_its_own(db_url, settings, scene):
    """Served next to a webserver it reaches by another name (compose's http://webserver:3000), the page links
    to the address the browser knows (OUTBOX_UI_URL) and launches through its own (--dagster-url)."""
    ui, api = "https://dagster.example.internal", f"http://127.0.0.1:{free_port()}"
    running = serve_in_thread("127.0.0.1", 0, database_url=db_url, settings=settings, ui_url=ui, dagster_url=api)
    try:
        with httpx.Client(base_url=running.url, timeout=30, headers={"Origin": running.url}) as c:
            assert f'href="{ui}/assets/outbox/{EVENTS}?view=checks"' in c.get("/").text
            answer = c.post("/actions/replay", data={"table": EVENTS, "event_id": "evt-lone"})
    finally:
        running.stop()
    assert answer.status_code == 503
    assert f"The Dagster UI at {api} does not answer" in answer.text and "--dagster-url" in answer.text


def test_a_request_for_another_host_name_is_refused(client, scene):
    """A page of another site cannot reach the on-call page by a DNS name of its own (DNS rebinding)."""
    port = client.base_url.port
    assert client.get("/", headers={"Host": f"attacker.example:{port}"}).status_code == 421
    assert client.get("/", headers={"Host": f"localhost:{port}"}).status_code == 200


def test_served_from_a_thread_on_a_free_port_and_refused_on_a_remote_address(db_url, settings, scene):
    running = serve_in_thread("127.0.0.1", 0, database_url=db_url, settings=settings)
    try:
        assert running.port > 0
        page = httpx.get(running.url + f"/tables/{EVENTS}", timeout=10)
        assert page.status_code == 200 and "evt-head" in page.text
    finally:
        running.stop()
    assert not running.thread.is_alive()
    with pytest.raises(Exception, match="refusing to serve the on-call page on 0.0.0.0"):
        serve_in_thread("0.0.0.0", 0, database_url=db_url, settings=settings)
