"""What the on-call engineer must see, in a real browser (issue 43, item 6).

Headless Chromium against a running ``outbox-pipelines dev`` (conftest.py, scenario.py): ``orders_outbox`` has
dead messages, more than its ``dead_error`` (failing); ``payments_outbox`` two ordering keys held back by a dead
head (a warning); ``notifications_outbox`` a paused topic; ``crm_outbox`` a destination nothing listens on; one
healthy table. Each test reads the page as a person would (what is on the screen, what a click opens), not
Dagster's GraphQL, except to confirm what a click launched:

- the Catalog marks the failing table and not the healthy one, and no row reads "Never materialized"; a
  warning is not shown failing, and its table's page names it a warning with the check that says so; the
  on-call page grades every table (failing, warning, healthy) on one page;
- the paused topic is named as paused on its table's page;
- the dead message's row (event id, error code, the destination's answer) is on its table's dead_letters check
  page, and the blocked key's dead head on the blocked_keys check page;
- the alert's link opens a page that shows that dead message, on the port ``dev`` serves the UI on;
- from the check page, a replay of a dead message is launched, dry run first, in at most three clicks, with a
  reason typed for the audit; the row leaves ``dead``.
"""

import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Locator, Page, expect

from outbox_pipelines_tests.browser.scenario import (
    BLOCKED,
    BLOCKED_KEYS,
    DEAD,
    DEAD_EVENTS,
    PAUSED,
    PAUSED_TOPIC,
    REJECTION_DETAIL,
    REPLAYABLE,
    OncallScenario,
    blocked_head,
)
from outbox_pipelines_tests.processes import wait_until

# browser: Chromium; slow: a real dev (dagster dev, its daemon and code server) for the module, as test_webserver.py.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

# How long a page may take to show its data (the UI loads it after the page itself; the machine is shared).
SHOWN_MS = 60_000
REASON = "browser test: the destination is back"
RUNS_WITH_TAG = "query($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results { jobName } } } }"
HEALTH_WORDS = ("failing", "warning", "healthy", "degraded", "failed")


def catalog_row(page: Page, table: str) -> Locator:
    """The Catalog's row of ``table`` (asset key outbox/<table>)."""
    return page.locator('[class*="VirtualizedTable_row"]').filter(has_text=f"outbox / {table}")


def marks(row: Locator) -> set[str]:
    """What a row shows besides its text: its icons (by their accessible names) and its health words."""
    icons = row.get_by_role("img").evaluate_all("els => els.map(e => e.getAttribute('aria-label') || '')")
    text = row.inner_text().lower()
    return {f"icon:{i}" for i in icons if i} | {f"word:{w}" for w in HEALTH_WORDS if re.search(rf"\b{w}\b", text)}


FAILING_MARKS = {"icon:check_failed", "word:failing"}


def catalog_marks(page: Page, oncall: OncallScenario, table: str, wanted: Callable[[set[str]], bool]) -> set[str]:
    """What ``table``'s Catalog row shows that the healthy table's row does not; read until ``wanted`` holds, or
    for SHOWN_MS (the status column loads after the list)."""
    page.goto("/assets")
    healthy = oncall.layout.healthy[0]
    for name in (table, healthy):
        expect(catalog_row(page, name)).to_be_visible(timeout=SHOWN_MS)
    deadline = time.monotonic() + SHOWN_MS / 1000
    while True:
        shown = marks(catalog_row(page, table)) - marks(catalog_row(page, healthy))
        if wanted(shown) or time.monotonic() > deadline:
            return shown
        page.wait_for_timeout(1000)


def test_the_catalog_marks_a_failing_table(page: Page, oncall: OncallScenario) -> None:
    shown = catalog_marks(page, oncall, DEAD, lambda marked: bool(FAILING_MARKS & marked))
    assert FAILING_MARKS & shown, (
        f"the Catalog does not mark {DEAD} (dead messages over its dead_error: failing) apart from the healthy "
        f"{oncall.layout.healthy[0]}: its row shows {sorted(shown) or 'nothing more'}"
    )
    listed = page.locator('[class*="VirtualizedTable_inner"]').inner_text()
    assert "Never materialized" not in listed, f"an outbox table reads 'Never materialized' in the Catalog:\n{listed}"


def test_a_table_with_a_warning_is_not_shown_failing_and_its_page_says_warning(
    page: Page, oncall: OncallScenario
) -> None:
    """Issue 43: "a table with 5 dead messages and 2 blocked keys looks exactly like a healthy one". Open-source
    Dagster's Catalog Status column reads ERROR checks only (asset health is Dagster+'s), so a warning cannot
    colour it: the row must not read failing, and the table's own page (one click) names it a warning with why."""
    shown = catalog_marks(page, oncall, DEAD, lambda marked: bool(FAILING_MARKS & marked))
    assert FAILING_MARKS & shown, f"the failing {DEAD} is not marked, so the next assertion would prove nothing"
    warned = marks(catalog_row(page, BLOCKED)) - marks(catalog_row(page, oncall.layout.healthy[0]))
    assert not FAILING_MARKS & warned, f"{BLOCKED} (a warning) reads failing: {sorted(warned)}"
    page.goto(f"/assets/outbox/{BLOCKED}")
    # Its latest materialization's metadata: the key "health" and its value, and the checks not passing.
    expect(page.get_by_text("health", exact=True).first).to_be_visible(timeout=SHOWN_MS)
    expect(page.get_by_text("warning", exact=True).first).to_be_visible(timeout=SHOWN_MS)
    expect(page.get_by_text(re.compile(r"^blocked_keys warn")).first).to_be_visible(timeout=SHOWN_MS)


def test_the_oncall_page_grades_every_table(page: Page, oncall: OncallScenario) -> None:
    """Every table on one page, its health by its worst check: failing, warning, healthy; a paused topic is no lag."""
    page.goto(f"/assets/outbox/{DEAD}")
    page = click(page, oncall_link(page, oncall, DEAD), [], "the on-call page link")
    expect(page.get_by_role("link", name=re.compile("all tables", re.I)).first).to_be_visible(timeout=SHOWN_MS)
    page.get_by_role("link", name=re.compile("all tables", re.I)).first.click()
    healthy = oncall.layout.healthy[0]
    for table, health in ((DEAD, "failing"), (BLOCKED, "warning"), (PAUSED, "healthy"), (healthy, "healthy")):
        row = page.locator("tr").filter(has=page.get_by_role("link", name=table, exact=True))
        expect(row.first).to_be_visible(timeout=SHOWN_MS)
        expect(row.first.locator("td").first).to_have_text(health)
    expect(page.locator("tr").filter(has_text=PAUSED).first).to_contain_text(PAUSED_TOPIC)


def check_page(page: Page, table: str, check: str) -> None:
    page.goto(f"/assets/outbox/{table}?view=checks&checkDetail={check}")
    expect(page.get_by_text(check, exact=True).first).to_be_visible(timeout=SHOWN_MS)


def test_the_dead_message_and_its_error_are_on_its_tables_check_page(page: Page, oncall: OncallScenario) -> None:
    check_page(page, DEAD, "dead_letters")
    newest = DEAD_EVENTS[-1]
    row = page.locator("tr").filter(has_text=newest)
    expect(row.first).to_be_visible(timeout=SHOWN_MS)
    expect(row.first).to_contain_text("BAD_REQUEST")
    expect(row.first).to_contain_text(REJECTION_DETAIL)
    for event_id in DEAD_EVENTS:
        expect(page.locator("tr").filter(has_text=event_id).first).to_be_visible()


def test_a_blocked_keys_dead_head_is_on_its_tables_check_page(page: Page, oncall: OncallScenario) -> None:
    check_page(page, BLOCKED, "blocked_keys")
    for key in BLOCKED_KEYS:
        row = page.locator("tr").filter(has_text=blocked_head(key))
        expect(row.first).to_be_visible(timeout=SHOWN_MS)
        expect(row.first).to_contain_text(key)
        expect(row.first).to_contain_text(REJECTION_DETAIL)


def test_a_paused_topic_shows_on_its_table(page: Page, oncall: OncallScenario) -> None:
    page.goto(f"/assets/outbox/{PAUSED}")
    # One line of the page names the topic as paused (its metadata row, or a sentence).
    said = page.locator("tr, p, li").filter(has_text=re.compile("paused", re.I)).filter(has_text=PAUSED_TOPIC)
    expect(said.first).to_be_visible(timeout=SHOWN_MS)


def dead_letters_alert(oncall: OncallScenario) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for alert in oncall.receiver.alerts:
            body = alert.body if isinstance(alert.body, dict) else {}
            if body.get("table") == DEAD and body.get("status") == "firing" and "dead" in str(body.get("alert_key")):
                return body
        return None

    return wait_until(found, 60, f"a firing dead_letters alert for {DEAD}", on_timeout=oncall.diagnostics)


def test_the_alerts_link_opens_the_page_with_the_dead_message(page: Page, oncall: OncallScenario) -> None:
    alert = dead_letters_alert(oncall)
    link = str(alert.get("link") or "")
    served = urlsplit(oncall.ui_url).netloc
    assert urlsplit(link).netloc == served, (
        f"the alert links to {link!r}, but dev serves the UI on {oncall.ui_url} (dev --port {oncall.dev.port}, "
        "OUTBOX_UI_URL unset): the link opens nothing"
    )
    page.goto(link)
    row = page.locator("tr").filter(has_text=DEAD_EVENTS[-1])
    expect(row.first).to_be_visible(timeout=SHOWN_MS)
    expect(row.first).to_contain_text(REJECTION_DETAIL)


def oncall_link(page: Page, oncall: OncallScenario, table: str) -> Locator:
    """The link from Dagster's page to the on-call page of ``table``: a link off the Dagster UI naming the table."""
    ui = urlsplit(oncall.ui_url).netloc

    def hrefs() -> list[str]:
        found = page.locator("a[href]").evaluate_all("els => els.map(e => e.href)")
        return [h for h in found if urlsplit(h).netloc not in (ui, "") and table in h and "127.0.0.1" in h]

    try:
        href = wait_until(hrefs, SHOWN_MS / 1000, f"a link to the on-call page of {table}")[0]
    except pytest.fail.Exception:
        pytest.fail(
            f"{table}'s dead_letters check page links to no on-call page (no link off {oncall.ui_url} naming "
            f"{table}); its links: {page.locator('a[href]').evaluate_all('els => els.map(e => e.href)')}",
            pytrace=False,
        )
    return page.locator(f'a[href="{href}"]').first


def click(page: Page, target: Locator, clicks: list[str], what: str) -> Page:
    """Click ``target`` (a link that opens a new tab gives that tab); count it."""
    clicks.append(what)
    if target.get_attribute("target") == "_blank":
        with page.context.expect_page() as opened:
            target.click()
        new = opened.value
        new.wait_for_load_state()
        return new
    target.click()
    return page


def test_a_replay_is_launched_from_the_check_page_in_three_clicks(page: Page, oncall: OncallScenario) -> None:
    dead_before = oncall.dead_ids()
    assert REPLAYABLE in dead_before, f"the scenario's {REPLAYABLE} is not dead: {dead_before}"
    clicks: list[str] = []
    check_page(page, DEAD, "dead_letters")
    page = click(page, oncall_link(page, oncall, DEAD), clicks, "the on-call page link")

    row = page.locator("tr").filter(has_text=REPLAYABLE).first
    expect(row).to_be_visible(timeout=SHOWN_MS)
    page = click(page, row.get_by_role("button", name=re.compile(r"^replay", re.I)), clicks, "Replay (a dry run)")

    # The dry run's outcome, then the form that runs it for real, with the reason the audit keeps (typed).
    real = page.get_by_role("button", name=re.compile(r"for real|^replay$|confirm", re.I))
    expect(real).to_be_visible(timeout=120_000)
    expect(page.get_by_text(re.compile(r"dry run", re.I)).first).to_be_visible()
    reason = page.get_by_role("textbox", name=re.compile(r"why|reason", re.I))
    expect(reason).to_be_visible()
    reason.fill(REASON)
    page = click(page, real, clicks, "run it for real")
    assert len(clicks) <= 3, f"{len(clicks)} clicks: {clicks}"

    wait_until(
        lambda: REPLAYABLE not in oncall.dead_ids(),
        120,
        f"{REPLAYABLE} replayed (out of dead) after {clicks}",
        on_timeout=lambda: f"page:\n{page.inner_text('body')[:2000]}\n{oncall.diagnostics()}",
    )
    runs = oncall.graphql(RUNS_WITH_TAG, {"filter": {"tags": [{"key": "outbox/reason", "value": REASON}]}})
    tagged = [r["jobName"] for r in runs["runsOrError"]["results"]]
    assert "replay_dead_job" in tagged, f"no replay_dead_job run carries the reason typed (outbox/reason): {tagged}"
    audit = oncall.query(
        "SELECT code, detail FROM outbox_audit WHERE outbox_table = %s AND message_id = %s ORDER BY id",
        (DEAD, dead_before[REPLAYABLE]),
    )
    replayed = [r for r in audit if r["code"] == "outbox_replay"]
    assert replayed, f"no replay in {REPLAYABLE}'s audit: {audit}"
    assert any(REASON in str(r["detail"]) for r in replayed), (
        f"the reason typed ({REASON!r}) is kept with the Dagster run but not in {REPLAYABLE}'s audit "
        f"(outbox_audit, where every transition of a message is): {replayed}"
    )
