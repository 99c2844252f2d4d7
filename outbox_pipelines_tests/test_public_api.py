"""The public API is what users call, listed in docs/reference/api.md name for name; importing it loads the
application side only; the names it no longer exports still work for a release, with a warning that says where
they went."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import outbox_pipelines

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "api.md"
# A table row's first cell: | `Name` | ...
LISTED = re.compile(r"^\| `([A-Za-z_]\w*)` \|", re.MULTILINE)


def test_the_reference_page_lists_exactly_the_public_names():
    listed = LISTED.findall(PAGE.read_text())
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert sorted(listed) == sorted(outbox_pipelines.__all__)


def test_every_public_name_resolves():
    for name in outbox_pipelines.__all__:
        assert getattr(outbox_pipelines, name) is not None, name


def test_importing_the_package_loads_no_dagster_no_http_client_and_no_wing():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, outbox_pipelines; print(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    unwanted = ("dagster", "aiohttp", "httpx", "nats", "aiormq", "confluent_kafka", "starlette", "uvicorn")
    assert [m for m in loaded if m.split(".")[0] in unwanted] == []
    wings = ("outbox_pipelines.orders", "outbox_pipelines.examples", "outbox_pipelines.demo")
    assert [m for m in loaded if m.startswith(wings)] == []


def test_a_webhook_receiver_verifies_with_the_standard_library_alone():
    """A receiver installs the package to verify our signatures: it loads no Dagster, no HTTP or broker client."""
    script = (
        "import sys\n"
        "from outbox_pipelines import WebhookVerificationError, WebhookVerifier, verify_webhook\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert "outbox_pipelines.core.inbox.webhook_verification" in loaded
    unwanted = ("dagster", "aiohttp", "httpx", "nats", "aiormq", "confluent_kafka", "starlette", "uvicorn", "django")
    assert [m for m in loaded if m.split(".")[0] in unwanted] == []
    assert [m for m in loaded if m.startswith("outbox_pipelines.core.destinations")] == []


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("Relay", "outbox_pipelines.core.relay"),
        ("HttpDestination", "outbox_pipelines.core.destinations"),
        ("TableSettings", "outbox_pipelines.core.settings"),
        ("PRESETS", "outbox_pipelines.core.retry.all_presets()"),
    ],
)
def test_a_name_that_left_the_public_api_still_works_and_says_where_it_lives(name, home):
    with pytest.warns(
        DeprecationWarning, match=rf"outbox_pipelines\.{name} is not part of the public API .* {re.escape(home)}"
    ):
        value = getattr(outbox_pipelines, name)
    assert value is not None
    assert name not in outbox_pipelines.__all__
