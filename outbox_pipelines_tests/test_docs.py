"""The documents point at things that exist: every test the traceability matrix cites, every file path
the README and the design notes name. A refactor that moves a module or a test fails here, not in a
reader's hands."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/design.md", "docs/seeds.md", "docs/deploy.md", "docs/destinations.md", "bench/README.md"]

# `T/core/relay/test_loop.py::test_name` in docs/seeds.md: T is outbox_pipelines_tests.
TEST_REFERENCE = re.compile(r"T/([\w/]+\.py)::(\w+)")
# A repository path in backticks or a table cell: a known top-level folder, then a path.
PATH_REFERENCE = re.compile(r"(?<![\w/.-])((?:outbox_pipelines|outbox_pipelines_tests|sql|bench|docs|scripts|deploy)"
                            r"/[\w./-]*[\w/])")
# Paths written relative to the package (`core/relay/loop.py`, `defs/alerts.py`, `api/app.py`).
PACKAGE_PATH = re.compile(r"(?<![\w/.-])((?:core|defs|api)/[\w/-]*\w(?:\.py|/))")


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
