"""The wheel is what CI tests (issue 40, item 8): the package as a user installs it, not this checkout.

The sdist is built from the checkout and the wheel from the sdist (``python -m build``), so a file either leaves
out fails here. The wheel is installed (not editable) into a fresh environment outside the source tree; its
dependencies are the ones already in this test environment, seen through a ``.pth`` line that names this
environment's site-packages, a plain path: the ``.pth`` files in there, the editable install of outbox_pipelines
among them, are not run, so ``import outbox_pipelines`` finds the wheel's copy or nothing (checked below). Every
command runs with its working directory outside the checkout and PYTHONPATH unset:

- every file the package reads at run time (``sql/`` migrations and queries, ``dagster.yaml``, ``py.typed``, the
  LICENSE, every data file under ``outbox_pipelines/``) is in the wheel, and the installed package finds them in
  itself;
- ``outbox-pipelines demo`` from an empty directory runs end to end, says where it keeps its data (a directory of
  the user's), reuses it on the next run and starts afresh with ``--reset``;
- the adopter example (``examples/billing_service``) runs the README's walkthrough, ``dg scaffold defs`` and
  ``dg check defs`` included, with every process of it importing the wheel's outbox_pipelines;
- a team's least-privilege set-up (docs/deploy.md): an owner login that is no superuser makes the schema and the
  grants, and a producer, a relay and an operator each run as a login of their own group.
"""

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from outbox_pipelines_tests.helpers import stop_project_server
from outbox_pipelines_tests.sink import HttpSink
from outbox_pipelines_tests.test_adopting import EXAMPLE, TABLES, walkthrough_commands

pytestmark = pytest.mark.slow  # builds the package, installs it, runs the demo and dg as processes

REPO = Path(__file__).resolve().parents[1]
DEV_BIN = Path(sys.executable).parent
DEV_SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
ORDERS_LINE = r"^outbox_orders\s+0\s+0\s+0\s+{sent}\s+{dead}\s"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    prefix: Path  # the fresh environment
    bin: Path
    build_s: float
    install_s: float

    def python(self) -> str:
        return str(self.bin / "python")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _fresh_environment(prefix: Path) -> Path:
    """A virtual environment that sees this one's packages but not its editable outbox_pipelines."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    site_packages = Path(
        subprocess.run(
            [str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    )
    # A plain path, appended after the fresh environment's own site-packages: the wheel's package comes first,
    # and the .pth files in there (the editable install's among them) are never run.
    (site_packages / "zz_dependencies_of_the_test_environment.pth").write_text(f"{DEV_SITE_PACKAGES}\n")
    return prefix / "bin"


def _console_scripts_of_the_dependencies(bin_dir: Path) -> None:
    """This environment's console scripts (dg, dagster, …) for the fresh one: the same entry points, run by the
    fresh interpreter. Its own (outbox-pipelines, installed from the wheel) are left as they are."""
    shebang = f"#!{DEV_BIN / 'python'}"
    for script in DEV_BIN.iterdir():
        target = bin_dir / script.name
        if target.exists() or not script.is_file():
            continue
        try:
            text = script.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # a binary
        first, _, rest = text.partition("\n")
        if first.strip() in (shebang, f"#!{sys.executable}"):
            target.write_text(f"#!{bin_dir / 'python'}\n{rest}")
            target.chmod(0o755)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The sdist and wheel built from this checkout, the wheel installed into a fresh environment."""
    dist = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)],
        cwd=dist,
        capture_output=True,
        text=True,
        timeout=600,
        env=_clean_env(),
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    build_s = time.monotonic() - started
    (wheel,) = dist.glob("outbox_pipelines-*.whl")
    (sdist,) = dist.glob("outbox_pipelines-*.tar.gz")
    prefix = tmp_path_factory.mktemp("fresh-env")
    started = time.monotonic()
    bin_dir = _fresh_environment(prefix)
    pip = [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # --no-deps: the dependencies are this environment's; --ignore-installed: the editable install it sees
    # (by its metadata) is neither uninstalled nor taken for this one.
    subprocess.run(
        [*pip, "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        cwd=prefix,
        check=True,
        timeout=300,
        env=_clean_env(),
    )
    _console_scripts_of_the_dependencies(bin_dir)
    install_s = time.monotonic() - started
    print(
        f"wheel {wheel.name} {wheel.stat().st_size / 1e3:.0f} kB, sdist {sdist.stat().st_size / 1e3:.0f} kB; "
        f"built in {build_s:.1f}s, installed in {install_s:.1f}s"
    )
    return Installed(wheel, sdist, prefix, bin_dir, build_s, install_s)


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of this test run's OUTBOX_/DAGSTER_ settings, no PYTHONPATH,
    no active virtual environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OUTBOX_", "DAGSTER_", "PYTHONPATH", "VIRTUAL_ENV", "XDG_DATA_HOME", "PYTEST_"))
    }
    return {**env, **extra}


def _user_env(installed: Installed, **extra: str) -> dict[str, str]:
    """A shell with the fresh environment activated: its bin first on PATH, this environment's bin not at all."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p).resolve() != DEV_BIN.resolve()]
    return _clean_env(PATH=os.pathsep.join([str(installed.bin), *path]), VIRTUAL_ENV=str(installed.prefix), **extra)


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _shipped(path: Path, exclude: list[str]) -> bool:
    """A file of the package that goes into the wheel: not compiled, not left out by the wheel's ``exclude``."""
    relative = path.relative_to(REPO).as_posix()
    return "__pycache__" not in path.parts and path.suffix != ".pyc" and not any(fnmatch(relative, p) for p in exclude)


def test_the_wheel_holds_every_file_the_package_reads(installed, tmp_path):
    config = _pyproject()
    target = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    missing = []
    for package in target["packages"]:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and _shipped(path, target.get("exclude", [])):
                missing += [] if path.relative_to(REPO).as_posix() in names else [path.relative_to(REPO).as_posix()]
    for source, inside in target["force-include"].items():  # sql/ -> outbox_pipelines/_sql/, dagster.yaml, …
        origin = REPO / source
        files = [p for p in origin.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
        for path in sorted([origin] if origin.is_file() else files):
            name = f"{inside}/{path.relative_to(origin).as_posix()}" if origin.is_dir() else inside
            missing += [] if name in names else [f"{path.relative_to(REPO)} (as {name})"]
    version = config["project"]["version"]
    for name in (
        "outbox_pipelines/py.typed",
        "outbox_pipelines/_dagster.yaml",
        f"outbox_pipelines-{version}.dist-info/licenses/LICENSE",
    ):
        missing += [] if name in names else [name]
    sql_files = {p.relative_to(REPO / "sql").as_posix() for p in (REPO / "sql").rglob("*.sql")}
    assert {f for f in sql_files if f.startswith("migrations/")} and {f for f in sql_files if f.startswith("queries/")}
    missing += [f"sql/{f}" for f in sorted(sql_files) if f"outbox_pipelines/_sql/{f}" not in names]
    assert not missing, f"the wheel lacks files the package has: {missing}"
    with zipfile.ZipFile(installed.wheel) as wheel:
        assert wheel.read(f"outbox_pipelines-{version}.dist-info/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        assert wheel.read("outbox_pipelines/_dagster.yaml") == (REPO / "dagster.yaml").read_bytes()

    # The sdist a wheel can be rebuilt from: the package, its SQL and dagster.yaml, the metadata's files; none of
    # the checkout's environments, databases or history.
    with tarfile.open(installed.sdist) as sdist:
        top = installed.sdist.name.removesuffix(".tar.gz")
        members = {m.name.removeprefix(f"{top}/") for m in sdist.getmembers()}
    needed = {"pyproject.toml", "README.md", "LICENSE", "dagster.yaml", *(f"sql/{f}" for f in sql_files)}
    assert not needed - members, f"the sdist lacks {sorted(needed - members)}"
    leaked = sorted(m for m in members if m.split("/")[0] in (".venv", ".outbox", ".git", "dist", "build"))
    assert not leaked, f"the sdist holds files of the checkout: {leaked[:10]}"

    # The installed package finds what it reads inside itself, from a directory that is no project.
    probe = _run(
        [
            installed.python(),
            "-c",
            "import json, sys, importlib.resources as r, outbox_pipelines as p\n"
            "from outbox_pipelines.core.storage.queries import named_queries, sql_dir\n"
            "from outbox_pipelines.defs.dagster_home import dagster_yaml_source\n"
            "print(json.dumps({'package': p.__file__, 'version': p.__version__, 'sql': str(sql_dir()),\n"
            "  'migrations': sorted(f.name for f in (sql_dir() / 'migrations').glob('*.sql')),\n"
            "  'queries': len(named_queries()), 'dagster_yaml': str(dagster_yaml_source()),\n"
            "  'py_typed': r.files('outbox_pipelines').joinpath('py.typed').is_file(), 'path': sys.path,\n"
            "  'editable': sorted(m for m in sys.modules if 'editable' in m)}))",
        ],
        cwd=tmp_path,
        env=_user_env(installed),
    )
    found = json.loads(probe.stdout)
    prefix = str(installed.prefix.resolve())
    for key in ("package", "sql", "dagster_yaml"):
        assert found[key].startswith(prefix), f"{key} is {found[key]}, not in the installed wheel"
    assert str(REPO) not in found["path"] and not found["editable"], found
    assert found["version"] == version and found["py_typed"] and found["queries"] > 0
    assert found["migrations"] == sorted(p.name for p in (REPO / "sql" / "migrations").glob("*.sql"))


@pytest.mark.timeout(600)
def test_the_demo_runs_from_an_empty_directory_and_keeps_its_data_in_the_users_directory(installed, tmp_path):
    empty, home = tmp_path / "empty", tmp_path / "home"
    empty.mkdir()
    home.mkdir()
    data = home / ".local" / "share" / "outbox-pipelines" / "demo"  # XDG_DATA_HOME unset: its default
    env = _user_env(installed, HOME=str(home))
    timings = {}
    try:
        started = time.monotonic()
        first = _run(["outbox-pipelines", "demo"], empty, env)
        timings["first run"] = time.monotonic() - started
        said = first.stdout.splitlines()[0]
        assert said.startswith(f"the demo keeps its data in {data} (no project here"), first.stdout[:2000]
        assert "migrated the database" in first.stdout
        assert re.search(ORDERS_LINE.format(sent=12, dead=1), first.stdout, re.M), first.stdout
        assert "asset checks: 31 passed" in first.stdout, first.stdout
        assert f"export OUTBOX_EMBEDDED_DIR={data}" in first.stdout
        assert list(empty.iterdir()) == [], "the demo wrote into the directory it was run in"
        assert (data / "pgdata").exists() and (data / "dagster_home" / "dagster.yaml").is_file()

        started = time.monotonic()
        second = _run(["outbox-pipelines", "demo", "--quiet"], empty, env)
        timings["second run"] = time.monotonic() - started
        assert second.stdout.splitlines()[0] == said  # the same directory, its data reused
        assert "migrated the database" not in second.stdout
        assert re.search(ORDERS_LINE.format(sent=24, dead=2), second.stdout, re.M), second.stdout

        started = time.monotonic()
        reset = _run(["outbox-pipelines", "demo", "--reset", "--quiet"], empty, env)
        timings["--reset"] = time.monotonic() - started
        assert reset.stdout.splitlines()[0] == f"{said} (reset: its earlier data was removed)"
        assert "migrated the database" in reset.stdout
        assert re.search(ORDERS_LINE.format(sent=12, dead=1), reset.stdout, re.M), reset.stdout

        # What the demo's last line says to do: the other commands find its data by OUTBOX_EMBEDDED_DIR.
        stop = _run(["outbox-pipelines", "db", "stop"], empty, {**env, "OUTBOX_EMBEDDED_DIR": str(data)})
        assert f"stopped the embedded PostgreSQL under {data}" in stop.stdout + stop.stderr
        assert list(empty.iterdir()) == []
    finally:
        stop_project_server(data)
    print("demo from an empty directory, from the wheel: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))


def test_the_demo_reset_leaves_a_projects_data_alone(installed, tmp_path):
    project = tmp_path / "project"
    (project / ".outbox").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    refused = subprocess.run(
        ["outbox-pipelines", "demo", "--reset"],
        cwd=project,
        env=_user_env(installed, HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"remove {project / '.outbox'} yourself" in refused.stderr
    assert sorted(p.name for p in project.iterdir()) == [".outbox", "pyproject.toml"]


@pytest.fixture
def billing_project(tmp_path: Path) -> Iterator[Path]:
    """A copy of the adopter example, its outbox declaration left for the walkthrough to scaffold; each process
    that imports the service records which outbox_pipelines it imported (in ``imported.txt``)."""
    root = tmp_path / "billing_service"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__", ".outbox", "*.egg-info"))
    shutil.rmtree(root / "billing_service" / "defs" / "outbox")
    init = root / "billing_service" / "__init__.py"
    init.write_text(
        init.read_text() + "\nimport os as _os\n\nif _os.environ.get('WHEEL_TEST_IMPORTED'):\n"
        "    import sys as _sys\n\n    import outbox_pipelines as _outbox_pipelines\n\n"
        "    with open(_os.environ['WHEEL_TEST_IMPORTED'], 'a') as _record:\n"
        "        _record.write(f'{_sys.executable} {_outbox_pipelines.__file__}\\n')\n"
    )
    yield root


def test_the_wheel_registers_its_parts_and_prints_the_example_settings(installed, tmp_path):
    """What the docs send an adopter to, from the installed wheel: the opt-in parts (entry points), the example
    that lists every key (``init --print-example``) and a first outbox.toml (``init``)."""
    env = _user_env(installed)
    parts = _run(
        [installed.python(), "-c", "from outbox_pipelines.core import wings; print(sorted(wings.installed_parts()))"],
        tmp_path,
        env,
    )
    assert parts.stdout.strip() == "['examples', 'orders']"
    example = _run(["outbox-pipelines", "init", "--print-example"], tmp_path, env)
    assert example.stdout == (REPO / "outbox.example.toml").read_text()
    project = tmp_path / "shop"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "shop"\nversion = "1"\n')
    _run(["outbox-pipelines", "init"], project, env)
    assert "[tables.shop_outbox]" in (project / "outbox.toml").read_text()
    _run(["outbox-pipelines", "init", "--example-project", "billing"], tmp_path, env)
    copied = sorted(p.relative_to(tmp_path / "billing").as_posix() for p in (tmp_path / "billing").rglob("*.*"))
    shipped = sorted(p.relative_to(EXAMPLE).as_posix() for p in EXAMPLE.rglob("*.*") if "__pycache__" not in p.parts)
    assert copied == shipped


@pytest.mark.timeout(600)
def test_the_adopter_example_runs_the_readme_walkthrough_from_the_wheel(installed, tmp_path, billing_project, db_url):
    sink = HttpSink().start()
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    imported = tmp_path / "imported.txt"
    env = _user_env(
        installed,
        OUTBOX_DATABASE_URL=db_url,
        BILLING_WEBHOOK_URL=f"{sink.url}invoices",
        DAGSTER_HOME=str(dagster_home),
        WHEEL_TEST_IMPORTED=str(imported),
    )
    timings = []
    try:
        commands = walkthrough_commands()
        for step in ("dg scaffold defs", "dg check defs"):
            assert any(c.startswith(step) for c in commands), f"the walkthrough no longer runs {step}: {commands}"
        for command in commands:
            started = time.monotonic()
            done = _run(shlex.split(command), billing_project, env)
            timings.append(f"{command.split(' --')[0][:40]} {time.monotonic() - started:.1f}s")
            if command.startswith("dg scaffold defs"):  # the scaffolder's files come from the wheel
                scaffolded = billing_project / "billing_service" / "defs" / "billing" / "defs.yaml"
                assert "type: outbox_pipelines.OutboxComponent" in scaffolded.read_text()
                shutil.copy(EXAMPLE / "billing_service" / "defs" / "outbox" / "defs.yaml", scaffolded)
        assert sink.counts == {"invoice-1": 1}, sink.counts
        assert all(re.search(rf"^{t}\s+0\s+0\s+0\s+1\s+0", done.stdout, re.M) for t in TABLES), done.stdout
    finally:
        sink.stop()
    records = imported.read_text().splitlines()
    print("walkthrough from the wheel: " + ", ".join(timings) + f"; {len(records)} processes imported the service")
    assert records, "no process imported the service"
    prefix = str(installed.prefix.resolve())
    outside = [r for r in records if not r.split(" ", 1)[1].startswith(prefix)]
    assert not outside, f"processes imported an outbox_pipelines that is not the wheel's: {outside}"


PRODUCER = """
import sys
import psycopg
from outbox_pipelines import Message, Outbox

outbox = Outbox("billing_outbox")
with psycopg.connect(sys.argv[1]) as conn:  # one transaction: the business rows' and the messages'
    outbox.enqueue_many(
        conn,
        [
            Message(topic="invoice.issued", payload={"invoice": n}, event_id=f"inv-{n}",
                    ordering_key=f"customer-{n % 40}" if n % 3 == 0 else None)
            for n in range(int(sys.argv[2]))
        ],
    )
"""


@pytest.mark.timeout(300)
def test_a_team_s_logins_run_the_wheel_s_schema_relay_and_hand_fixes_with_no_superuser(installed, tmp_path, pg_server):
    """A database as the deployment guide sets it up, from the wheel: an owner login that is no superuser runs
    ``db upgrade`` and ``db grant`` on an empty database of its own; a producer login enqueues, a relay login drains,
    an operator's login fixes rows by hand, each in its group role. The operator's UPDATE of 2,000 rows, after eight
    one-row UPDATEs in its session, ends far inside its statement timeout (the audit's check reads its rows once:
    migration 0026) and leaves one audit row per statement, naming the operator. No password is printed."""
    tag = f"w{os.getpid()}_{secrets.token_hex(3)}"
    logins = {who: (f"{tag}_{who}", secrets.token_hex(12)) for who in ("owner", "producer", "relay", "ops")}
    database = f"{tag}_team"
    admin_url = pg_server.admin_url

    def url(who: str) -> str:
        name, password = logins[who]
        params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(admin_url).items() if v is not None}
        params.update(dbname=database, user=name, password=password)
        return psycopg.conninfo.make_conninfo(**params)

    with psycopg.connect(admin_url, autocommit=True) as admin:
        for who, (name, password) in logins.items():
            rights = sql.SQL(" CREATEROLE") if who == "owner" else sql.SQL("")
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}{}").format(
                    sql.Identifier(name), sql.Literal(password), rights
                )
            )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(tag + "_owner"))
        )
    project = tmp_path / "team"
    project.mkdir()
    (project / "outbox.toml").write_text('[tables.billing_outbox]\ndestination = "paper"\n')
    printed = []
    try:
        as_owner = _user_env(installed, OUTBOX_DATABASE_URL=url("owner"))
        printed += [_run(["outbox-pipelines", "db", "upgrade"], project, as_owner)]
        with psycopg.connect(url("owner")) as owner:
            if owner.info.server_version < 150000:  # deploy.md: on 14, a superuser gives the owner schema public once
                with psycopg.connect(psycopg.conninfo.make_conninfo(admin_url, dbname=database), autocommit=True) as su:
                    su.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(logins["owner"][0])))
        printed += [_run(["outbox-pipelines", "db", "grant"], project, as_owner)]
        with psycopg.connect(admin_url, autocommit=True) as admin:  # the DBA, who may grant the groups: their ADMIN
            for who, group in (
                ("producer", "outbox_producer"),
                ("relay", "outbox_relay"),
                ("ops", "outbox_maintainer"),
            ):
                admin.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(logins[who][0])))
        _run([installed.python(), "-c", PRODUCER, url("producer"), "3000"], project, _user_env(installed))
        as_relay = _user_env(installed, OUTBOX_DATABASE_URL=url("relay"))
        drained = _run(["outbox-pipelines", "relay", "--table", "billing_outbox", "--once"], project, as_relay)
        printed += [drained]
        assert "claimed 3000, sent 3000" in drained.stdout, drained.stdout

        with psycopg.connect(url("ops"), autocommit=True) as ops:
            ops.execute("SET statement_timeout = '20s'")
            for row_id in range(1, 9):
                ops.execute("UPDATE billing_outbox SET status = 'pending', attempts = 0 WHERE id = %s", (row_id,))
            started = time.monotonic()
            fixed = ops.execute(
                "UPDATE billing_outbox SET status = 'pending', attempts = 0 WHERE id > 1000 AND id <= 3000"
            ).rowcount
            fix_s = time.monotonic() - started
        assert fixed == 2000
        assert fix_s < 5, f"a hand UPDATE of 2,000 rows took {fix_s:.1f}s"
        print(f"an operator's UPDATE of 2,000 rows by hand: {1000 * fix_s:.0f} ms")
        with psycopg.connect(url("owner"), autocommit=True) as owner:
            audited = owner.execute(
                "SELECT login, code, count(*) FROM outbox_audit WHERE outbox_table = 'billing_outbox' "
                "GROUP BY login, code ORDER BY login, code"
            ).fetchall()
        assert audited == [
            (logins["ops"][0], "outbox_untold_change", 9),  # one a statement: eight of one row, one of 2,000
            (logins["relay"][0], "outbox_flush_success", 3000),
        ], audited
        again = _run(["outbox-pipelines", "relay", "--table", "billing_outbox", "--once"], project, as_relay)
        printed += [again]
        assert "claimed 2008, sent 2008" in again.stdout, again.stdout
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
            for name, _ in logins.values():
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    output = "".join(done.stdout + done.stderr for done in printed)
    assert not [who for who, (_, password) in logins.items() if password in output]
