"""The documents point at things that exist: every test the traceability matrix cites, every file path
any page names. A refactor that moves a module or a test fails here, not in a reader's hands. The docs
site builds with MkDocs in strict mode (a broken link or anchor fails), and the README stays short."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from outbox_pipelines_tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
# Every markdown page: the repository's own, the docs site's, the benchmark's guide.
DOCS = [
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "bench/README.md",
    *sorted(str(page.relative_to(ROOT)) for page in (ROOT / "docs").rglob("*.md")),
]
README_MAX_LINES = 250

# `T/core/relay/test_loop.py::test_name` in docs/seeds.md: T is outbox_pipelines_tests.
TEST_REFERENCE = re.compile(r"T/([\w/]+\.py)::(\w+)")
# A repository path in backticks or a table cell: a known top-level folder, then a path.
PATH_REFERENCE = re.compile(
    r"(?<![\w/.-])((?:outbox_pipelines|outbox_pipelines_tests|sql|bench|docs|scripts|deploy"
    r"|examples)"
    r"/[\w./-]*[\w/])"
)
# Paths written relative to the package (`core/relay/loop.py`, `defs/alerts.py`, `orders/api/app.py`).
PACKAGE_PATH = re.compile(r"(?<![\w/.-])((?:core|defs|api|orders)/[\w/-]*\w(?:\.py|/))")


def _text(name: str) -> str:
    return (ROOT / name).read_text()


def test_every_test_the_seed_matrix_cites_exists():
    missing = []
    for path, name in TEST_REFERENCE.findall(_text("docs/seeds.md")):
        source = ROOT / "outbox_pipelines_tests" / path
        if not source.is_file() or not re.search(rf"^(async )?def {name}\(", source.read_text(), re.MULTILINE):
            missing.append(f"T/{path}::{name}")
    assert not missing, "docs/seeds.md cites tests that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("document", DOCS)
def test_every_path_a_document_names_exists(document):
    text = _text(document)
    missing = set()
    for path in PATH_REFERENCE.findall(text):
        if "*" in path or "<" in path or path.startswith("bench/.runs"):
            continue  # patterns and generated output, not files in the repository
        if not (ROOT / path.rstrip("/.")).exists():
            missing.add(path)
    for path in PACKAGE_PATH.findall(text):
        if not (ROOT / "outbox_pipelines" / path.rstrip("/")).exists():
            missing.add(path)
    assert not missing, f"{document} names paths that do not exist: {sorted(missing)}"


def test_the_readme_is_short():
    lines = len(_text("README.md").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move the "
        "detail into docs/ (tutorial, how-to, reference or explanation)"
    )


def _bash_block(document: str, heading: str) -> str:
    text = _text(document)
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], re.S)
    assert block is not None, f"{document}: no bash block under {heading!r}"
    return block.group(1)


def test_the_example_file_names_every_key_a_section_takes():
    """outbox.example.toml is where a team looks for a key: every key the settings accept is named in it."""
    from outbox_pipelines.core.settings.registry import TABLE_KEYS

    text = _text("outbox.example.toml")
    # Named as a key: first on its line (or in the comma-separated list that starts it), commented or set.
    named = [rf"^#?\s*(?:\w+,\s*)*{re.escape(key)}(?=[\s,=])" for key in sorted(TABLE_KEYS)]
    missing = [
        key for key, pattern in zip(sorted(TABLE_KEYS), named, strict=True) if not re.search(pattern, text, re.M)
    ]
    assert not missing, f"outbox.example.toml does not name {missing}"


def test_the_walkthrough_is_the_same_in_the_readme_and_the_tutorial():
    """test_adopting.py runs the README's block; the tutorial's copy must be that block, word for word."""
    assert _bash_block("docs/tutorial/add-an-outbox.md", "# Add an outbox to your service") == _bash_block(
        "README.md", "## Add an outbox to your service"
    )


# The demo's lines that are the same on every run (no run id, order id or path), as the docs show them.
DEMO_STABLE_LINE = re.compile(r"^(Order API|enqueued|table |outbox_\w+ |broker executed|asset checks:)")


def _demo_sample(document: str) -> list[str]:
    """The stable lines of the demo output a document shows (its fenced block holding the Order API line)."""
    block = re.search(r"```\n([^`]*?Order API \(seed 001\).*?)```", _text(document), re.S)
    assert block is not None, f"{document}: no sample of the demo's output"
    return [line for line in block.group(1).splitlines() if DEMO_STABLE_LINE.match(line)]


@pytest.mark.timeout(300)
def test_the_demo_prints_what_the_readme_and_the_tutorial_show(cli_env, tmp_path):
    """README's first command: the output a reader compares with the sample, line for line (a sample left
    behind by a change, such as a count of asset checks, fails here)."""
    # Outside any project the demo keeps its files in the user's data directory: this test's own.
    demo = run_cli({**cli_env, "XDG_DATA_HOME": str(tmp_path / "data")}, "demo", timeout=280, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr[-3000:]
    printed = demo.stdout.splitlines()
    for document in ("README.md", "docs/tutorial/getting-started.md"):
        sample = _demo_sample(document)
        assert len(sample) >= 8, f"{document}: the sample lost its stable lines: {sample}"
        missing = [line for line in sample if line not in printed]
        assert not missing, f"{document} shows lines the demo does not print: {missing}\n{demo.stdout}"


def test_the_docs_site_builds_with_no_broken_link(tmp_path):
    """mkdocs.yml validates every link and anchor between pages and every page's place in the nav as a
    warning; --strict fails the build on any warning."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-5000:] + built.stderr[-5000:]
    assert (tmp_path / "site" / "index.html").is_file()


GENERATED = re.compile(
    r"<!-- generated: python -m outbox_pipelines\.core\.settings\.registry (\w+) -->\n\n"
    r"((?:\|.*\n)+)"
)


def test_the_reference_tables_are_the_settings_registry_as_rendered():
    """docs/reference/configuration.md's generated tables say what the registry the engine reads says."""
    from outbox_pipelines.core.settings.registry import render_environment_markdown, render_table_keys_markdown

    renderers = {"environment": render_environment_markdown, "keys": render_table_keys_markdown}
    found = GENERATED.findall(_text("docs/reference/configuration.md"))
    assert sorted(name for name, _ in found) == sorted(renderers), found
    for name, table in found:
        assert table == renderers[name](), (
            f"docs/reference/configuration.md: the {name} table differs from the "
            f"registry; regenerate it: python -m outbox_pipelines.core.settings."
            f"registry {name}"
        )


OUTCOME_TABLE = re.compile(
    r"<!-- generated: python -m outbox_pipelines\.core\.destinations\.outcome_tables (\w+) -->\n\n"
    r"((?:\|.*\n)+)"
)


def test_the_outcome_tables_are_the_classifiers_rows_as_rendered():
    """Each destination's outcome table shows once in the docs, as its classifiers' rows render it."""
    from outbox_pipelines.core.destinations.outcome_tables import TABLES, render_markdown

    found = [(document, name, table) for document in DOCS for name, table in OUTCOME_TABLE.findall(_text(document))]
    assert sorted(name for _, name, _ in found) == sorted(TABLES), [(document, name) for document, name, _ in found]
    for document, name, table in found:
        assert table == render_markdown(name), (
            f"{document}: the {name} outcome table differs from the code's rows; regenerate it: "
            f"python -m outbox_pipelines.core.destinations.outcome_tables {name}"
        )
