"""Where the database is: ``OUTBOX_DATABASE_URL``, or else the embedded default (``resolve_database``).

Re-exports, for callers that import them from ``db``, names owned by ``database_url``, ``project_dir``,
``embedded`` and ``connections``. A monkeypatch of a name here changes nothing the code reads: patch it in the
module that owns it.
"""

import os
import sys
from dataclasses import dataclass

from outbox_pipelines.core.redaction import mask_url
from outbox_pipelines.core.storage.connections import connect, driver_connection
from outbox_pipelines.core.storage.database_url import (
    DATABASE_URL_ENV,
    parse_url,
    psycopg_url,
    scrub,
    sqlalchemy_url,
    url_with_database,
)
from outbox_pipelines.core.storage.embedded import (
    EMBEDDED_DATABASE,
    EMBEDDED_SERVER_OPTIONS,
    create_database_if_missing,
    start_embedded,
    stop_embedded,
)
from outbox_pipelines.core.storage.embedded_as_root import RELOCATED_DATA_BASE, SERVER_USER_AS_ROOT
from outbox_pipelines.core.storage.embedded_socket import (
    SOCKET_DIR_PREFIX,
    SOCKET_NAME,
    SOCKET_PATH_MAX,
    embedded_socket_dir,
    private_socket_dir,
)
from outbox_pipelines.core.storage.project_dir import (
    EMBEDDED_DIR_ENV,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    PROJECT_MARKERS,
    embedded_dir,
    make_private_dirs,
    private_embedded_dir,
    project_root,
    refuse_a_server_outside_any_project,
    refuse_an_unasked_server,
    write_private_file,
)

__all__ = [
    "DATABASE_URL_ENV",
    "EMBEDDED_DATABASE",
    "EMBEDDED_DIR_ENV",
    "EMBEDDED_SERVER_OPTIONS",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PROJECT_MARKERS",
    "RELOCATED_DATA_BASE",
    "SERVER_USER_AS_ROOT",
    "SOCKET_DIR_PREFIX",
    "SOCKET_NAME",
    "SOCKET_PATH_MAX",
    "ResolvedDatabase",
    "connect",
    "create_database_if_missing",
    "driver_connection",
    "embedded_dir",
    "embedded_socket_dir",
    "make_private_dirs",
    "mask_url",
    "parse_url",
    "private_embedded_dir",
    "private_socket_dir",
    "project_root",
    "psycopg_url",
    "refuse_a_server_outside_any_project",
    "resolve_database",
    "scrub",
    "sqlalchemy_url",
    "start_embedded",
    "stop_embedded",
    "url_with_database",
    "write_private_file",
]


@dataclass(frozen=True)
class ResolvedDatabase:
    url: str
    embedded: bool
    description: str


def resolve_database(announce: bool = True, *, may_start_embedded: bool = False) -> ResolvedDatabase:
    """OUTBOX_DATABASE_URL's database, else the project's embedded server: started when ``may_start_embedded`` (dev,
    demo) or when it was asked for before (``.outbox/`` exists, OUTBOX_EMBEDDED_DIR), else ConfigError."""
    url = os.environ.get(DATABASE_URL_ENV)
    if url:
        parse_url(url)  # a malformed URL is a ConfigError here, with its password masked
        return ResolvedDatabase(psycopg_url(url), False, f"using {mask_url(url)} (OUTBOX_DATABASE_URL)")
    root = embedded_dir()
    if not may_start_embedded:
        refuse_an_unasked_server(root)
    refuse_a_server_outside_any_project(root)
    url = start_embedded(root)
    resolved = ResolvedDatabase(
        url, True, f"using the embedded PostgreSQL under {root}: {mask_url(url)} (OUTBOX_DATABASE_URL is unset)"
    )
    if announce:
        print(resolved.description, file=sys.stderr)
    return resolved
