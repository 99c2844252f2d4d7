"""The import-linter contracts in pyproject.toml: the framework-free core never imports Dagster or Starlette,
and the engine never imports the order wing (core/orders)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "kept, 0 broken" in result.stdout, result.stdout
    assert "The engine never imports the order wing" in result.stdout
