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
    for contract in ("The core never imports Dagster", "The engine never imports a wing", "Layers of the package",
                     "Rooms of the engine"):
        assert contract in result.stdout, result.stdout
