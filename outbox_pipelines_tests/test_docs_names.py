"""What the prose names exists: every Python name in backticks (``core.relay.loop.Relay``, ``models.STATES``)
and every file path in a page or a module docstring, and every page-and-heading citation
(``docs/explanation/relay.md, "Claim modes"``). Prose cites pages, never a seed's section or an internal
issue number, and the states are drawn once. A rename fails here with the list of what to repoint."""

import ast
import importlib
import importlib.metadata
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path

import outbox_pipelines

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "outbox_pipelines"
PAGES = ["README.md", "CONTRIBUTING.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

BACKTICKED = re.compile(r"`+([^`\s]+?)`+")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
NOT_PYTHON = {"py", "md", "toml", "yaml", "yml", "sql", "json", "txt", "png", "cfg", "ini", "lock", "html", "sh", "com"}
FILE_PATH = re.compile(
    r"(?<![\w/.-])((?:outbox_pipelines|outbox_pipelines_tests)/[\w/-]*\w\.py|[\w-]+(?:/[\w-]+)*/\w+\.py)"
)
CITATION = re.compile(r"docs/explanation/([\w-]+\.md),?\s+(?:\"([^\"\n]+)\"|'([^'\n]+)'|“([^”\n]+)”)")
# A section sign (but an RFC's), an internal issue number, or the design notes that were folded into docs/explanation/.
SEED_OR_ISSUE = re.compile(r"(?<!RFC \d{4} )§|\bissues? #?\d+\b|design\.md", re.IGNORECASE)
# Names in backticks that read as ours but are a variable of the sentence, not an attribute path.
SPELLINGS = {
    "session.commit": "a SQLAlchemy Session's commit",
    "body.idempotency_key": "the Order API request body's field",
    "errors.Join": "Go's errors.Join, as seed 004 names it",
    "registry.set_enabled": "a HandlerRegistry instance's method",
    "session.timeout.ms": "librdkafka's consumer setting (the Kafka consumer example)",
}


@cache
def _modules() -> dict[str, str]:
    """Every module of the package by dotted name."""
    names = {"outbox_pipelines": "outbox_pipelines"}
    for info in pkgutil.walk_packages(outbox_pipelines.__path__, "outbox_pipelines."):
        names[info.name] = info.name
    return names


@cache
def _other_names() -> set[str]:
    """Dotted names that are no attribute path: the package's logger names and entry-point groups."""
    loggers = set()
    for path in PACKAGE.rglob("*.py"):
        loggers |= set(re.findall(r"getLogger\(\s*[\"']([\w.]+)[\"']", path.read_text()))
    return loggers | set(importlib.metadata.entry_points().groups)


def _module_docstrings() -> dict[str, str]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc:
            found[str(path.relative_to(ROOT))] = doc
    return found


def _has(obj: object, name: str) -> object | None:
    if hasattr(obj, name):
        return getattr(obj, name)
    if inspect.isclass(obj):  # a field or an attribute set in __init__
        for klass in obj.__mro__:
            if name in getattr(klass, "__annotations__", {}):
                return object()
        try:
            if re.search(rf"\bself\.{name}\b", inspect.getsource(obj)):
                return object()
        except (OSError, TypeError):
            pass
    return None


def _resolve_from(module_name: str, rest: list[str]) -> bool:
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError:
        return False
    for part in rest:
        sub = f"{getattr(obj, '__name__', '')}.{part}"
        if inspect.ismodule(obj) and sub in _modules():
            obj = importlib.import_module(sub)
            continue
        found = _has(obj, part)
        if found is None:
            return False
        obj = found
    return True


def _missing_name(dotted: str) -> bool:
    """True when the name reads as one of ours (its first part is a module of the package) and resolves nowhere."""
    parts = dotted.split(".")
    if parts[-1] in NOT_PYTHON or dotted in SPELLINGS or dotted in _other_names():
        return False
    if parts[0] == "outbox_pipelines":
        return not _resolve_from("outbox_pipelines", parts[1:])
    candidates = [name for name in _modules() if name.rsplit(".", 1)[-1] == parts[0]]
    if candidates:
        return not any(_resolve_from(name, parts[1:]) for name in candidates)
    owners = _classes().get(parts[0], [])  # Relay.run, OutboxTable.claim: a class of ours, then its attribute
    if owners:
        return not any(_resolve_from(owner, parts) for owner in owners)
    return False  # not ours: psycopg.sql, gc.freeze, os.environ ...


@cache
def _classes() -> dict[str, list[str]]:
    """The package's classes by name: the modules that define each."""
    found: dict[str, list[str]] = {}
    for name in _modules():
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        if not path.is_file():
            path = PACKAGE.parent / name.replace(".", "/") / "__init__.py"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(name)
    return found


def _names_in(text: str) -> set[str]:
    return {m.group(1) for token in BACKTICKED.findall(text) if (m := DOTTED.match(token))}


def test_every_python_name_the_docs_and_docstrings_give_exists():
    missing = []
    for page in PAGES:
        missing += [f"{page}: {name}" for name in sorted(_names_in((ROOT / page).read_text())) if _missing_name(name)]
    for path, doc in _module_docstrings().items():
        missing += [f"{path}: {name}" for name in sorted(_names_in(doc)) if _missing_name(name)]
    assert not missing, "names that no longer exist:\n" + "\n".join(missing)


def _path_exists(path: str, near: Path) -> bool:
    bases = [ROOT, PACKAGE, PACKAGE / "core", ROOT / "outbox_pipelines_tests", near.parent, near.parent.parent]
    return any((base / path).exists() for base in bases)


def test_every_file_a_module_docstring_names_exists():
    missing = []
    for path, doc in _module_docstrings().items():
        for named in sorted(set(FILE_PATH.findall(doc))):
            if "<" not in named and "*" not in named and not _path_exists(named, ROOT / path):
                missing.append(f"{path}: {named}")
    assert not missing, "module docstrings name files that do not exist:\n" + "\n".join(missing)


def _headings(page: str) -> set[str]:
    text = (ROOT / "docs" / "explanation" / page).read_text()
    return {h.strip().strip("`").lower().replace("`", "") for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def _prose_files() -> list[Path]:
    return [
        *sorted(PACKAGE.rglob("*.py")),
        *sorted((ROOT / "sql" / "queries").glob("*.sql")),
        *(ROOT / page for page in PAGES),
        ROOT / "outbox.example.toml",
        ROOT / "pyproject.toml",
    ]


def test_every_page_and_heading_a_comment_cites_exists():
    missing = []
    for path in [*_prose_files(), *sorted((ROOT / "outbox_pipelines_tests").rglob("*.py"))]:
        for page, *quoted in CITATION.findall(path.read_text()):
            heading = next(text for text in quoted if text)
            if not (ROOT / "docs" / "explanation" / page).is_file():
                missing.append(f"{path.relative_to(ROOT)}: docs/explanation/{page} (no such page)")
            elif heading.lower().replace("`", "") not in _headings(page):
                missing.append(f"{path.relative_to(ROOT)}: docs/explanation/{page}, {heading!r} (no such heading)")
    assert not missing, "citations of pages or headings that do not exist:\n" + "\n".join(missing)


def test_prose_cites_pages_not_seed_sections_or_issue_numbers():
    """docs/seeds.md maps the seeds' sections to tests (its purpose); the CHANGELOG keeps history."""
    found = []
    for path in _prose_files():
        if path.name in ("seeds.md", "design.md"):  # the seeds' own map; where the old numbered notes went
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if SEED_OR_ISSUE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "cite the docs page instead:\n" + "\n".join(found)


# A module docstring says what the module is for and what it keeps true, in a few lines; the why is on an
# explanation page, cited by page and heading. Docstrings that are a user's usage example are exempt.
DOCSTRING_MAX_LINES = 6
USAGE_EXAMPLES = {"outbox_pipelines/__init__.py", "outbox_pipelines/testing.py"}


def test_module_docstrings_are_a_few_lines():
    long = [
        f"{path}: {len(doc.strip().splitlines())} lines"
        for path, doc in _module_docstrings().items()
        if path not in USAGE_EXAMPLES and len(doc.strip().splitlines()) > DOCSTRING_MAX_LINES
    ]
    assert not long, (
        f"module docstrings over {DOCSTRING_MAX_LINES} lines (move the why to docs/explanation/ and cite it):\n"
        + "\n".join(long)
    )
