"""The outbox on-call page: one line per declared table (counts per state, blocked keys, paused topics, the
oldest waiting message, its health by its worst check), each table's dead and blocked messages, a search by
event id, ordering key or tenant, and Replay… / Skip… on each dead message, launched as the same Dagster jobs
(a dry run first, then for real with a reason), so run history stays in Dagster.

Served by ``outbox-pipelines oncall-page`` (``serve``) or from another process's thread (``serve_in_thread``);
``build_app`` is the ASGI app. Not the engine's: it uses Starlette and uvicorn, which the Dagster webserver
installs.
"""

from outbox_pipelines.oncall_page.app import RunningPage, build_app, serve, serve_in_thread

__all__ = ["RunningPage", "build_app", "serve", "serve_in_thread"]
