"""Every program of docs/how-to/enqueue-from-your-stack.md runs, as written, against a fresh database: the
page's ```python blocks are marked ``<!-- run: NAME -->`` (a program) or ``<!-- file: PATH -->`` (a file of
the Django project the ``django`` program imports). Each program runs in its own process with only its
placeholder URL (``...app@localhost/app``) or the Django settings' environment pointed at the test database,
and must leave its business rows and their messages committed together."""

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import DictRow

from outbox_pipelines.core.storage import schema
from outbox_pipelines.core.storage.db import parse_url, sqlalchemy_url

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "how-to" / "enqueue-from-your-stack.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
MARKED = re.compile(r"^<!-- (run|file): ([\w./-]+) -->\n```python\n(.*?)^```", re.M | re.S)
PLACEHOLDER = "app@localhost/app"
# Programs run a second time with a change to their text: the page says the change is all it takes.
VARIANTS = {"sqlalchemy-async-on-psycopg": ("sqlalchemy-async", "postgresql+asyncpg://", "postgresql+psycopg://")}


def _blocks() -> tuple[dict[str, str], dict[str, str]]:
    text = PAGE.read_text()
    programs: dict[str, str] = {}
    files: dict[str, str] = {}
    for kind, name, body in MARKED.findall(text):
        target = programs if kind == "run" else files
        assert name not in target, f"{PAGE.name}: two blocks are marked {kind}: {name}"
        target[name] = body
    unmarked = len(BLOCK.findall(text)) - len(programs) - len(files)
    assert unmarked == 0, f"{PAGE.name}: {unmarked} python block(s) without <!-- run: NAME --> or <!-- file: PATH -->"
    return programs, files


PROGRAMS, FILES = _blocks()
RUNS = {name: (name, "", "") for name in PROGRAMS} | VARIANTS


def _pointed_at(source: str, db_url: str) -> str:
    """``source`` with each placeholder URL replaced by the test database's, in the form its driver reads."""
    psycopg_sqlalchemy = sqlalchemy_url(db_url)
    plain = psycopg_sqlalchemy.replace("postgresql+psycopg://", "postgresql://", 1)
    for scheme, url in (
        ("postgresql+psycopg://", psycopg_sqlalchemy),
        ("postgresql+asyncpg://", psycopg_sqlalchemy.replace("+psycopg", "+asyncpg", 1)),
        ("postgresql://", plain),
    ):
        source = source.replace(f"{scheme}{PLACEHOLDER}", url)
    return source


def _environment(db_url: str) -> dict[str, str]:
    """The process's environment: no OUTBOX_ setting of the test run, and the Django settings' connection."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OUTBOX_", "POSTGRES_", "PG"))}
    info = parse_url(db_url)
    env |= {
        "POSTGRES_DB": info.get("dbname") or "",
        "POSTGRES_USER": info.get("user") or "",
        "POSTGRES_PASSWORD": info.get("password") or "",
        "POSTGRES_HOST": info.get("host") or "",
        "POSTGRES_PORT": info.get("port") or "",
    }
    return env


def _run(name: str, db_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    schema.create_table(db_url, "orders_outbox")  # the page's table, as `db upgrade` makes a declared one
    program, old, new = RUNS[name]
    assert old in PROGRAMS[program], f"{name}: {program!r} no longer holds {old!r}"
    source = _pointed_at(PROGRAMS[program].replace(old, new), db_url)
    assert PLACEHOLDER not in source, f"{program}: a database URL the test does not know how to point: {source}"
    for path, body in FILES.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body)
        for package in target.relative_to(tmp_path).parents[:-1]:  # shop/, shop/management/, ...
            (tmp_path / package / "__init__.py").touch()
    script = tmp_path / f"run_{program.replace('-', '_')}.py"  # not psycopg.py: it would shadow psycopg
    script.write_text(source)
    return subprocess.run(
        [sys.executable, script.name],
        cwd=tmp_path,
        env=_environment(db_url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _order_messages(conn: psycopg.Connection[DictRow]) -> list[tuple[str, str]]:
    rows = conn.execute(
        "SELECT payload->>'order_id' AS order_id, event_id FROM orders_outbox WHERE topic = 'order.placed' ORDER BY id"
    )
    return [(row["order_id"], row["event_id"]) for row in rows]


def _assert_each_order_has_its_message(
    conn: psycopg.Connection[DictRow], table: str, done: subprocess.CompletedProcess[str]
) -> list[str]:
    """The customers of the orders in ``table``, once every order's message is there, and no other."""
    rows = conn.execute(f"SELECT id::text AS id, customer FROM {table} ORDER BY id").fetchall()
    assert rows, f"no row in {table}:\n{done.stdout}{done.stderr}"
    assert _order_messages(conn) == [(row["id"], f"order-{row['id']}-placed") for row in rows]
    return [row["customer"] for row in rows]


@pytest.mark.parametrize("name", sorted(set(RUNS) - {"refused", "django"}))
def test_each_stack_commits_the_business_row_and_its_message_together(name, db_url, conn, tmp_path):
    done = _run(name, db_url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _assert_each_order_has_its_message(conn, "orders", done) == ["acme"]


def test_the_django_views_and_command_commit_the_models_and_their_messages_together(db_url, conn, tmp_path):
    done = _run("django", db_url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    customers = _assert_each_order_has_its_message(conn, "shop_order", done)
    assert customers == ["acme", "globex", "initech", "umbrella"]
    assert "placed 2 orders" in done.stdout


def test_no_transaction_is_refused_and_outside_transaction_writes_on_purpose(db_url, conn, tmp_path):
    done = _run("refused", db_url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would commit the message apart from the business write" in done.stdout
    topics = [row["topic"] for row in conn.execute("SELECT topic FROM orders_outbox ORDER BY id")]
    assert topics == ["service.started"]
