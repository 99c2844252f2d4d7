"""A real browser against a real ``outbox-pipelines dev`` (issue 43, item 6).

One scenario per test module (``oncall``, scenario.py): a project with a dead message, two keys blocked by a
dead head, a destination down and a paused topic, under ``outbox-pipelines dev --port <free>``, ready once its
UI answers and its on-call sensor has finished a tick. One headless Chromium per module (Debian's ``chromium``
at /usr/bin/chromium, driven by Playwright's Python client; its driver ships in the wheel, no browser is
downloaded), and a fresh page for each test.

Chromium missing fails the tests with the line that installs it (``.ci/run`` installs it), as a missing
nats-server or PgBouncer does: a browser test that is skipped would pass a broken on-call view.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outbox_pipelines_tests.browser.scenario import OncallScenario

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
INSTALL_HINT = (
    f"{CHROMIUM} is missing: `apt-get install chromium` (Debian/Ubuntu), or run `bash .ci/run`, which installs it"
)
VIEWPORT = {"width": 1280, "height": 800}
SCENARIO_TABLES = 5  # the four failing tables and one healthy one


@pytest.fixture(scope="module")
def oncall(pg_server: Any) -> Iterator[OncallScenario]:
    name, url = pg_server.create_database()

    def drop() -> None:
        for database in (f"{name}_dagster"[:63], name):
            pg_server.drop_database(database)

    scenario = OncallScenario(url, tables=SCENARIO_TABLES, on_close=drop)
    try:
        try:
            scenario.start()
        except Exception as exc:
            raise RuntimeError(f"the on-call scenario did not start: {exc}\n{scenario.diagnostics()}") from exc
        scenario.dismiss_community_popup()
        yield scenario
    finally:
        scenario.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(INSTALL_HINT, pytrace=False)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, oncall: OncallScenario) -> Iterator[Any]:
    """A fresh page (its own context: no storage left by another test); 30 s for each wait by default."""
    context = browser.new_context(viewport=VIEWPORT, base_url=oncall.ui_url)
    context.set_default_timeout(30_000)
    tab = context.new_page()
    try:
        yield tab
    finally:
        context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing browser test's report carries dev's last lines and the alerts received."""
    outcome = yield
    report = outcome.get_result()
    scenario = item.funcargs.get("oncall") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(scenario, OncallScenario):
        report.sections.append(("on-call scenario", scenario.diagnostics()))
