"""The states are drawn once (docs/explanation/how-a-message-moves.md, "States"), and the drawing says what the
SQL does: its states are the ones the schema allows, and each arrow is made by some named query of
sql/queries/ that reads rows in the arrow's first state and writes its last (a DELETE for "deleted")."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explanation" / "how-a-message-moves.md"
ARROW = re.compile(r"^(\w+)\s+--.*?-+>\s*(\w+)", re.MULTILINE)
STATES_CHECK = re.compile(r"CHECK \(status IN \(([^)]*)\)\)")


def _arrows(text: str) -> list[tuple[str, str]]:
    return ARROW.findall(text)


def _stored_states() -> set[str]:
    found = STATES_CHECK.search((ROOT / "sql" / "migrations" / "0001_core.sql").read_text())
    assert found, "the status CHECK of sql/migrations/0001_core.sql moved: read the states from where it went"
    return set(re.findall(r"'(\w+)'", found.group(1)))


def _named_queries() -> dict[str, str]:
    queries = {}
    for path in sorted((ROOT / "sql" / "queries").glob("*.sql")):
        for block in re.split(r"^-- name: ", path.read_text(), flags=re.MULTILINE)[1:]:
            name, _, body = block.partition("\n")
            sql = "\n".join(line.split("--", 1)[0] for line in body.splitlines())  # no comments
            queries[name.strip()] = sql
    return queries


SET_CLAUSE = re.compile(r"\bSET\b(.*?)(?=\bWHERE\b|\bFROM\b|\bRETURNING\b|$)", re.DOTALL)


def _writes(sql: str) -> set[str]:
    """The states an UPDATE's SET clause gives (``status = 'x'``, or a CASE of them); "deleted" for a DELETE."""
    written = set()
    for clause in SET_CLAUSE.findall(sql):
        for value in re.findall(r"\bstatus\s*=\s*('\w+'|CASE\b.*?\bEND\b)", clause, re.DOTALL):
            written |= set(
                re.findall(
                    r"'(\w+)'",
                    value if value.startswith("'") else " ".join(re.findall(r"\b(?:THEN|ELSE)\s+'\w+'", value)),
                )
            )
    if re.search(r"\bDELETE\s+FROM\s+\{table\}", sql):
        written.add("deleted")
    return written


def _reads(sql: str) -> str:
    """The query without its SET clauses: where the states it reads rows in are named."""
    return SET_CLAUSE.sub(" ", sql)


def test_exactly_one_page_draws_the_states():
    drawn = [
        str(page.relative_to(ROOT))
        for page in sorted((ROOT / "docs").rglob("*.md"))
        if len([a for a in _arrows(page.read_text()) if a[0] in _stored_states()]) >= 3
    ]
    assert drawn == [str(PAGE.relative_to(ROOT))], f"the states are drawn on {drawn}: keep one drawing, link to it"


def test_the_drawing_names_the_stored_states_and_nothing_else():
    arrows = _arrows(PAGE.read_text())
    assert len(arrows) >= 10, arrows
    named = {state for arrow in arrows for state in arrow}
    assert named - {"deleted"} == _stored_states(), named


def test_every_arrow_is_a_transition_some_named_query_makes():
    queries = _named_queries()
    unmade = [
        f"{before} -> {after}"
        for before, after in _arrows(PAGE.read_text())
        if not any(f"'{before}'" in _reads(sql) and after in _writes(sql) for sql in queries.values())
    ]
    assert not unmade, f"no named query in sql/queries/ makes these arrows of {PAGE.name}: {unmade}"


def test_every_state_the_queries_write_is_drawn():
    written = set().union(*(_writes(sql) for sql in _named_queries().values())) & (_stored_states() | {"deleted"})
    drawn = {after for _, after in _arrows(PAGE.read_text())}
    assert written <= drawn, f"the queries write {sorted(written - drawn)}, which the drawing never reaches"
