"""CHANGELOG.md keeps its form (CONTRIBUTING.md, "Versions and deprecations" and "Releasing"): sections by version,
newest first, `## [Unreleased]` or `## [x.y.z] - YYYY-MM-DD`; the Keep a Changelog subsections and Upgrade notes;
entries of one or two lines that name no internal issue; and versions that agree with pyproject.toml's."""

import re
import tomllib
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "CHANGELOG.md").read_text()
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

UNRELEASED = "[Unreleased]"
RELEASED = re.compile(r"\[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})")
SUBSECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Upgrade notes"}
MAX_LINE = 120


def _version(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
    assert match is not None, f"pyproject.toml's version {text!r} is not x.y.z"
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


def _sections() -> list[str]:
    """The text after `## ` of each version heading, in the file's order."""
    return re.findall(r"^## (.*)$", TEXT, re.MULTILINE)


def _released() -> list[tuple[tuple[int, int, int], date]]:
    released = []
    for heading in _sections():
        match = RELEASED.fullmatch(heading)
        if match:
            major, minor, patch, day = match.groups()
            released.append(((int(major), int(minor), int(patch)), date.fromisoformat(day)))
    return released


def test_every_section_is_unreleased_or_a_dated_version():
    headings = _sections()
    assert headings, "CHANGELOG.md has no `## ` section"
    bad = [heading for heading in headings if heading != UNRELEASED and not RELEASED.fullmatch(heading)]
    assert not bad, f"headings that are neither `## [Unreleased]` nor `## [x.y.z] - YYYY-MM-DD`: {bad}"
    assert headings.count(UNRELEASED) <= 1, "more than one `## [Unreleased]`"
    if UNRELEASED in headings:
        assert headings[0] == UNRELEASED, "`## [Unreleased]` comes first, above every released version"
    for heading in headings:
        match = RELEASED.fullmatch(heading)
        if match:
            date.fromisoformat(match.group(4))  # raises on a day that does not exist (2026-02-30)


def test_versions_go_newest_first():
    released = _released()
    versions = [version for version, _ in released]
    days = [day for _, day in released]
    assert versions == sorted(versions, reverse=True), f"versions out of order: {versions}"
    assert len(set(versions)) == len(versions), f"a version appears twice: {versions}"
    assert days == sorted(days, reverse=True), f"release dates out of order: {days}"


def test_subsections_are_the_known_ones_and_sit_under_a_version():
    before_first = TEXT.split("\n## ", 1)[0]
    assert "\n### " not in before_first, "a `### ` subsection before the first `## ` section"
    unknown = sorted({name for name in re.findall(r"^### (.*)$", TEXT, re.MULTILINE) if name not in SUBSECTIONS})
    assert not unknown, f"subsections other than {sorted(SUBSECTIONS)}: {unknown}"
    assert not re.search(r"^#{4,} ", TEXT, re.MULTILINE), "headings deeper than `### `"


def test_no_internal_issue_is_named():
    found = re.findall(r"\bissues?\s*#?\s*\d+", TEXT, re.IGNORECASE)
    assert not found, f"a user cannot look up an internal issue: {found}"


def test_entries_are_one_or_two_lines():
    long_lines = [line for line in TEXT.splitlines() if len(line) > MAX_LINE]
    assert not long_lines, f"lines over {MAX_LINE} characters: {long_lines}"
    entries: list[list[str]] = []
    entry: list[str] | None = None
    for line in TEXT.splitlines():
        if line.startswith("- "):
            entry = [line]
            entries.append(entry)
        elif entry is not None and line.startswith("  ") and line.strip():
            entry.append(line)  # the entry's continuation
        else:
            entry = None
    too_long = [entry[0] for entry in entries if len(entry) > 2]
    assert not too_long, f"entries longer than two lines: {too_long}"


def test_the_versions_agree_with_pyproject():
    """pyproject.toml's version is the newest released one, or the one the Unreleased section will become: newer
    than every released version, with `## [Unreleased]` there to say what it will hold."""
    current = _version(PYPROJECT_VERSION)
    released = [version for version, _ in _released()]
    if current in released:
        assert current == released[0], f"pyproject.toml's {PYPROJECT_VERSION} is older than the newest release"
    else:
        assert all(version < current for version in released), (
            f"pyproject.toml's {PYPROJECT_VERSION} is older than a released version: {released}"
        )
        assert UNRELEASED in _sections(), f"{PYPROJECT_VERSION} is not released: its entries go under [Unreleased]"
