"""The one settings registry: every key a ``[tables.NAME]`` section may carry (``table_keys``) and every
environment variable the engine reads (``variables``), each with its default and meaning; the docs' Markdown tables
are rendered from them (``markdown``), so the check and the docs cannot disagree.
``python -m outbox_pipelines.core.settings.registry [keys|environment]`` prints them.
"""

from outbox_pipelines.core.settings.registry.markdown import (
    render_environment_markdown,
    render_markdown,
    render_table_keys_markdown,
)
from outbox_pipelines.core.settings.registry.table_keys import (
    GROUPS,
    KINDS,
    TABLE_KEY_REGISTRY,
    TABLE_KEYS,
    TABLE_KEYS_BY_NAME,
    TableKey,
    choices,
    keys_in,
)
from outbox_pipelines.core.settings.registry.variables import ENVIRONMENT, ENVIRONMENT_BY_NAME, EnvVariable

__all__ = [
    "ENVIRONMENT",
    "ENVIRONMENT_BY_NAME",
    "GROUPS",
    "KINDS",
    "TABLE_KEYS",
    "TABLE_KEYS_BY_NAME",
    "TABLE_KEY_REGISTRY",
    "EnvVariable",
    "TableKey",
    "choices",
    "keys_in",
    "render_environment_markdown",
    "render_markdown",
    "render_table_keys_markdown",
]
