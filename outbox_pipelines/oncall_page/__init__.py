"""The outbox on-call page: one line per declared table, each table's dead and blocked messages, a search, and
Replay… / Skip… launched as the same Dagster jobs (a dry run first), so run history stays in Dagster.

Served by ``outbox-pipelines oncall-page`` (``serve``) or a thread (``serve_in_thread``); ``build_app`` is the ASGI
app. Not the engine's: it uses Starlette and uvicorn.
"""

from outbox_pipelines.oncall_page.app import RunningPage, build_app, serve, serve_in_thread

__all__ = ["RunningPage", "build_app", "serve", "serve_in_thread"]
