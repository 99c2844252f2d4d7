"""What the package says of itself: one version (pyproject.toml's), shown by ``__version__`` and ``--version``;
a licence, in the metadata and as a file; ``py.typed``, so the types inside reach the users' type checkers."""

import tomllib
from importlib.metadata import metadata
from pathlib import Path

import outbox_pipelines
from outbox_pipelines_tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_is_pyproject_tomls_in_python_and_on_the_command_line(cli_env):
    assert outbox_pipelines.__version__ == PROJECT["version"]
    shown = run_cli(cli_env, "--version")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"outbox-pipelines {PROJECT['version']}"


def test_the_licence_is_in_the_metadata_and_beside_the_code():
    assert PROJECT["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert metadata("outbox_pipelines")["License-Expression"] == "MIT"


def test_the_package_says_it_is_typed():
    assert (Path(outbox_pipelines.__file__).parent / "py.typed").is_file()
    assert "Typing :: Typed" in PROJECT["classifiers"]
