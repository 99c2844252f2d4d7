"""The import-linter contracts in pyproject.toml: the framework-free core never imports Dagster or Starlette,
the engine never imports a wing (the order product, the examples), the package is layered (entry points over
the Dagster layer over the wings over the engine) and so are the engine's rooms."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept, 0 broken" in result.stdout, result.stdout
    for contract in (
        "The core never imports Dagster",
        "The engine never imports a wing",
        "Layers of the package",
        "Rooms of the engine",
    ):
        assert contract in result.stdout, result.stdout


def _wing_names() -> set[str]:
    """What only a wing may name: its tables, roles, metrics, environment variables and modules, read from the
    wings themselves (core/wings.py), so a name a wing adds is checked without editing this test."""
    import re

    import outbox_pipelines  # noqa: F401 (declares the wings)
    from outbox_pipelines.core import wings

    names = {"outbox_pipelines.orders", "outbox_pipelines.examples", "OUTBOX_API_TOKEN"}
    for wing in wings.wings():
        names |= set(wing.shipped_tables) | set(wing.shared_tables) | set(wing.producer_excluded_tables)
        names |= {role.name for role in wing.roles} | set(wing.destinations.values())
        names |= {name for name in wing.retry_presets if len(name) > 6}  # "orders" is also an English word
    source = (REPO / "outbox_pipelines/orders/metrics.py").read_text()
    names |= set(re.findall(r'(?:Counter|Histogram|Gauge)\(\s*"(\w+)"', source))
    assert "outbox_orders" in names and "order_requests_total" in names and "idempo_ledger" in names
    assert "automated_email_recipients" in names and "outbox_order_api" in names
    return names


def test_the_engine_names_none_of_the_wings_tables_roles_or_metrics() -> None:
    """The engine (outbox_pipelines/core and its SQL) reaches a wing only through core/wings.py: a wing's
    table, role, metric, variable or module named in it is a leak across the fence, whether import-linter can
    see it (an import) or not (a string, a query)."""
    names = _wing_names()
    engine = [
        *sorted((REPO / "outbox_pipelines/core").rglob("*.py")),
        REPO / "sql/queries/outbox.sql",
        REPO / "sql/queries/shared.sql",
        REPO / "sql/queries/roles.sql",
        REPO / "sql/queries/bootstrap.sql",
    ]
    leaks = []
    for path in engine:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            leaks += [f"{path.relative_to(REPO)}:{number}: {name}" for name in names if name in line]
    assert not leaks, "the engine names a wing's own names:\n" + "\n".join(leaks)


def test_no_module_of_the_package_is_over_400_lines() -> None:
    """Modules of one job stay small enough to read in one sitting (issue 27): split a module along its jobs
    before it grows past this, rather than raising the limit."""
    long = {
        str(path.relative_to(REPO)): n
        for path in sorted((REPO / "outbox_pipelines").rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 400
    }
    assert not long, f"modules over 400 lines: {long}"


def test_every_room_of_the_engine_says_what_it_owns() -> None:
    """Each package of the engine opens with a docstring naming its job (what a newcomer reads first)."""
    import ast

    silent = [
        str(init.relative_to(REPO))
        for init in sorted((REPO / "outbox_pipelines/core").glob("*/__init__.py"))
        if not ast.get_docstring(ast.parse(init.read_text()))
    ]
    assert not silent, f"packages without a docstring: {silent}"


def _contracts() -> list[dict]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layered(container: str) -> set[str]:
    """The names a layers contract over ``container`` lists (``a | b`` names both)."""
    (contract,) = [c for c in _contracts() if c["type"] == "layers" and c.get("containers") == [container]]
    return {name.strip() for layer in contract["layers"] for name in layer.replace(":", "|").split("|")}


def _packages(directory: Path) -> set[str]:
    return {p.parent.name for p in directory.glob("*/__init__.py")}


def test_every_room_of_the_engine_and_of_the_package_is_in_a_layers_contract() -> None:
    """A room added under core/ (or a package added at the top) is placed in the layers before it can import
    anything: no room outside the fences, so no cycle between rooms can grow unseen."""
    assert _packages(REPO / "outbox_pipelines/core") - _layered("outbox_pipelines.core") == set()
    assert _packages(REPO / "outbox_pipelines") - _layered("outbox_pipelines") == set()


def test_each_destination_transport_is_a_folder_and_the_transports_stand_alone() -> None:
    """destinations/ holds one folder per transport (no name prefix standing in for a folder), and the
    independence contract lists every one of them."""
    destinations = REPO / "outbox_pipelines/core/destinations"
    transports = _packages(destinations)
    prefixed = sorted(p.name for p in destinations.glob("*_*.py") if p.name.split("_")[0] in transports)
    assert not prefixed, f"modules named after a transport outside its folder: {prefixed}"
    (independent,) = [c for c in _contracts() if c["type"] == "independence"]
    assert {m.rsplit(".", 1)[1] for m in independent["modules"]} == transports


def test_the_package_top_holds_only_entry_points() -> None:
    """Modules at the package's top are what users and Dagster name (the API, the Definitions, the dev command,
    the testing helpers, the instance storage dagster.yaml names); everything else lives in a room."""
    top = {p.stem for p in (REPO / "outbox_pipelines").glob("*.py")}
    assert top == {"__init__", "definitions", "dev", "testing", "dagster_storage"}, top
