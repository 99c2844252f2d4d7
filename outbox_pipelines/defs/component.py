"""``OutboxComponent``: a project's outbox tables declared in its own Dagster project (defs.yaml).

``dg scaffold defs outbox_pipelines.OutboxComponent billing`` writes ``defs/billing/defs.yaml``; each entry of
``attributes.tables`` is a table's section as outbox.toml writes it, and ``attributes.parts`` its parts. Several
components in one project are one declaration. More: docs/explanation/front-ends.md, "Dagster".
"""

import os
from pathlib import Path
from typing import Any

import dagster as dg

from outbox_pipelines.core.settings.declarations import (
    component_files,
    load_components,
    read_component_yaml,
    refuse_two_declarations,
)
from outbox_pipelines.core.storage.project_dir import project_root
from outbox_pipelines.defs.factory import outbox_definitions

TEMPLATE = """\
type: outbox_pipelines.OutboxComponent

# The outbox tables of this project, each as outbox.toml's [tables.NAME] section (outbox.example.toml lists
# every key; `outbox-pipelines init --print-example` prints it). `outbox-pipelines db upgrade` creates each table.
# `dg check defs` fails on a section that cannot be used; a running code location goes on without that
# table, and its relay check and one alert say why.
attributes:
  tables:
    {table}:
      destination: http
      url: "{{{{ env.{env} }}}}"   # set {env} where Dagster runs; unset, the table is refused at load
      mode: competing
"""


class OutboxScaffolder(dg.Scaffolder):
    """defs.yaml declaring one table named after the component's directory (``billing`` -> billing_outbox)."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        stem = "".join(c if c.isalnum() else "_" for c in request.target_path.name.lower()).strip("_") or "app"
        table = stem if stem.endswith("outbox") else f"{stem}_outbox"
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(TEMPLATE.format(table=table, env=f"{stem.upper()}_WEBHOOK_URL"))


@dg.scaffold_with(OutboxScaffolder)
class OutboxComponent(dg.Component, dg.Resolvable, dg.Model):
    """Outbox tables of this project: relay, maintenance, replay, backfill, checks and alerts for each."""

    tables: dict[str, dict[str, Any]] = {}
    parts: list[str] = []
    shipped_tables: bool = False

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        source = Path(context.path) / "defs.yaml"
        if source.is_file():
            read_component_yaml(source)  # a table given twice: refused, as outbox.toml refuses it
        root = project_root(source.parent)
        siblings = sorted(path.resolve() for path in component_files(root))
        refuse_two_declarations(root, siblings)  # tables in outbox.toml too: dg check defs says so
        if len(siblings) > 1 and source.resolve() in siblings:
            # Several teams' components in one project: the relay groups, jobs, sensors and the database
            # resource are the project's, once. The first component (by path) builds them for every component's
            # tables, as the CLI reads them (declarations.load_components); the others add nothing more.
            if source.resolve() != siblings[0]:
                return dg.Definitions()
            return outbox_definitions(declaration=load_components(siblings, os.environ))
        if source.is_file():  # read as the CLI reads it (declarations.load_components): the same sections
            return outbox_definitions(declaration=load_components([source.resolve()], os.environ))
        return outbox_definitions(self.tables, parts=self.parts, shipped_tables=self.shipped_tables, source=source)
