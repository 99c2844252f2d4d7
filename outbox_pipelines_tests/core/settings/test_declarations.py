"""Where a project declares its tables (outbox.toml or an OutboxComponent's defs.yaml) and how it is read."""

from pathlib import Path

import pytest

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.settings import load_settings
from outbox_pipelines.core.settings.declarations import find_declaration

DG_PROJECT = """[project]
name = "svc"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "svc"
"""
COMPONENT = """type: outbox_pipelines.OutboxComponent
attributes:
  tables:
    svc_outbox:
      destination: http
      url: "{{ env.SVC_HOOK }}"
      mode: competing
"""


def dg_project(root: Path, *components: str) -> Path:
    (root / "pyproject.toml").write_text(DG_PROJECT)
    for name in components:
        folder = root / "svc" / "defs" / name
        folder.mkdir(parents=True)
        (folder / "defs.yaml").write_text(COMPONENT)
    (root / "svc" / "deep").mkdir(parents=True, exist_ok=True)
    return root


def test_a_component_declares_only_its_tables_with_its_env_values(tmp_path):
    dg_project(tmp_path, "outbox")
    declaration = find_declaration({"SVC_HOOK": "https://hooks.example.com/svc"}, start=tmp_path / "svc" / "deep")
    assert declaration.source == tmp_path / "svc" / "defs" / "outbox" / "defs.yaml"
    assert declaration.parts == ()
    settings = load_settings(env={"SVC_HOOK": "https://hooks.example.com/svc"}, declaration=declaration)
    assert sorted(settings.tables) == ["svc_outbox"]
    assert settings.tables["svc_outbox"].url == "https://hooks.example.com/svc"


def test_a_component_value_from_an_unset_variable_leaves_that_table_out_saying_why(tmp_path):
    dg_project(tmp_path, "outbox")
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))
    assert settings.tables == {}
    told = settings.broken["svc_outbox"]
    assert "[tables.svc_outbox]" in told and "SVC_HOOK is not set" in told, told  # the variable, by name


def test_a_url_from_the_environment_may_hold_a_credential_a_url_written_in_the_file_may_not(tmp_path):
    """``url: "{{ env.NAME }}"`` is the URL from the deployment's environment (read as url_env = NAME): its
    user:password@ is taken; the same URL written in defs.yaml is refused, masked."""
    dg_project(tmp_path, "outbox")
    environ = {"SVC_HOOK": "https://svc:PwFromEnv1@hooks.example.com/svc?token=TokFromEnv2"}
    settings = load_settings(env=environ, declaration=find_declaration(environ, start=tmp_path))
    assert settings.broken == {} and settings.tables["svc_outbox"].url == environ["SVC_HOOK"]
    written = tmp_path / "svc" / "defs" / "outbox" / "defs.yaml"
    written.write_text(COMPONENT.replace('"{{ env.SVC_HOOK }}"', f'"{environ["SVC_HOOK"]}"'))
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))
    told = settings.broken["svc_outbox"]
    assert "holds a credential" in told and "PwFromEnv1" not in told and "TokFromEnv2" not in told


def test_tables_in_outbox_toml_and_in_a_component_are_refused_naming_both(tmp_path):
    """The command line and Dagster would each read one of them: one place, said by both."""
    dg_project(tmp_path, "outbox")
    (tmp_path / "outbox.toml").write_text('[tables.ledger_outbox]\ndestination = "paper"\n')
    with pytest.raises(ConfigError, match=r"outbox.toml declares tables and .*defs.yaml declares an OutboxCompo"):
        find_declaration({}, start=tmp_path / "svc")
    (tmp_path / "outbox.toml").write_text("embedded = true\n")  # settings only: the component's tables are read
    declaration = find_declaration({"SVC_HOOK": "https://h.example.com/x"}, start=tmp_path)
    assert sorted(declaration.tables) == ["svc_outbox"]


def test_outbox_toml_at_the_root_declares_only_its_tables_and_the_parts_it_names(tmp_path):
    (tmp_path / "outbox.toml").write_text('[tables.ledger_outbox]\ndestination = "paper"\n')
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))
    assert sorted(settings.tables) == ["ledger_outbox"] and settings.parts == ()
    (tmp_path / "outbox.toml").write_text('parts = ["orders"]\n[tables.ledger_outbox]\ndestination = "paper"\n')
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))
    assert sorted(settings.tables) == ["ledger_outbox", "outbox_orders"] and settings.parts == ("orders",)
    (tmp_path / "outbox.toml").write_text('shipped_tables = true\n[tables.ledger_outbox]\ndestination = "paper"\n')
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))
    assert {"ledger_outbox", "outbox_orders", "outbox_events", "outbox_memory", "outbox_members"} == set(
        settings.tables
    )
    (tmp_path / "outbox.toml").write_text('parts = "orders"\n')
    with pytest.raises(ConfigError, match=r"parts must be a list of part names, like parts = \[.orders.\]"):
        find_declaration({}, start=tmp_path)


def test_several_components_are_one_projects_tables_and_may_not_share_one(tmp_path):
    dg_project(tmp_path, "billing")
    payroll = tmp_path / "svc" / "defs" / "payroll"
    payroll.mkdir()
    (payroll / "defs.yaml").write_text(COMPONENT.replace("svc_outbox", "payroll_outbox") + "  parts: [orders]\n")
    declaration = find_declaration({"SVC_HOOK": "https://hooks.example.com/svc"}, start=tmp_path)
    assert sorted(declaration.tables) == ["payroll_outbox", "svc_outbox"] and declaration.parts == ("orders",)
    settings = load_settings(env={}, declaration=find_declaration({}, start=tmp_path))  # no SVC_HOOK: both broken
    assert str(payroll / "defs.yaml") in settings.broken["payroll_outbox"]
    assert str(tmp_path / "svc" / "defs" / "billing" / "defs.yaml") in settings.broken["svc_outbox"]
    (payroll / "defs.yaml").write_text(COMPONENT)
    with pytest.raises(ConfigError, match="payroll/defs.yaml: table 'svc_outbox' is declared in .*billing/defs.yaml"):
        find_declaration({}, start=tmp_path)


def test_without_a_dagster_project_no_defs_yaml_is_read(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "svc"\n')
    folder = tmp_path / "svc" / "defs" / "outbox"
    folder.mkdir(parents=True)
    (folder / "defs.yaml").write_text(COMPONENT)
    declaration = find_declaration({}, start=tmp_path)
    assert declaration.source is None and declaration.tables == {} and declaration.parts == ()


def test_a_top_level_typo_names_the_key_and_the_known_ones(tmp_path):
    (tmp_path / "outbox.toml").write_text("shiped_tables = false\n")
    with pytest.raises(ConfigError, match=r"unknown top-level keys \['shiped_tables'\].*tables, parts, shipped_tables"):
        find_declaration({}, start=tmp_path)


TWICE = """type: outbox_pipelines.OutboxComponent
attributes:
  tables:
    svc_outbox:
      destination: paper
    svc_outbox:
      destination: http
      url: https://hooks.example.com/svc
"""


def test_a_table_given_twice_in_defs_yaml_is_refused_as_toml_refuses_it(tmp_path):
    dg_project(tmp_path, "outbox")
    (tmp_path / "svc" / "defs" / "outbox" / "defs.yaml").write_text(TWICE)
    with pytest.raises(ConfigError, match=r"defs.yaml, line 6: 'svc_outbox' is given twice .* keep one"):
        find_declaration({}, start=tmp_path)
    (tmp_path / "outbox.toml").write_text('[tables.a]\ndestination = "paper"\n[tables.a]\ndestination = "http"\n')
    with pytest.raises(ConfigError, match="not valid TOML"):  # the same mistake in outbox.toml
        find_declaration({}, start=tmp_path)


@pytest.mark.slow
def test_dg_check_defs_refuses_a_table_given_twice(tmp_path):
    """The component's own reading (Dagster's) keeps the last section silently; the component refuses the file."""
    import subprocess
    import sys

    dg_project(tmp_path, "outbox")
    (tmp_path / "svc" / "__init__.py").write_text("")
    (tmp_path / "svc" / "definitions.py").write_text(
        "from pathlib import Path\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n"
    )
    (tmp_path / "svc" / "defs" / "outbox" / "defs.yaml").write_text(TWICE)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "DAGSTER_HOME": ""}
    env = {k: v for k, v in env.items() if v}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "dg"), "check", "defs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "'svc_outbox' is given twice" in output, output[-3000:]


def test_a_misspelt_attributes_or_tables_in_defs_yaml_is_named_with_its_fix(tmp_path):
    """Not "no table is declared" (the CLI read an empty declaration): the misspelt key, and the one meant."""
    dg_project(tmp_path, "outbox")
    written = tmp_path / "svc" / "defs" / "outbox" / "defs.yaml"
    written.write_text(COMPONENT.replace("attributes:", "atributes:"))
    with pytest.raises(ConfigError, match=r"unknown keys \['atributes'\] \('atributes': did you mean 'attributes'\?\)"):
        find_declaration({}, start=tmp_path)
    written.write_text(COMPONENT.replace("  tables:", "  tabels:"))
    with pytest.raises(ConfigError) as refused:
        find_declaration({}, start=tmp_path)
    assert "unknown keys under attributes ['tabels'] ('tabels': did you mean 'tables'?)" in str(refused.value)
    assert "attributes: tables: NAME:" in str(refused.value) and "[tables.NAME]" not in str(refused.value)
