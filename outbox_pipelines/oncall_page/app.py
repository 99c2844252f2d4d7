"""The on-call page's web app (Starlette) and how it is served: ``build_app`` for any ASGI server,
``serve_in_thread`` beside others (``dev``), ``serve`` for ``outbox-pipelines oncall-page``.

It launches runs, so: loopback unless ``allow_remote``, only requests addressed to such a host, and an action only
by POST from one of its own pages (Origin or Referer).
"""

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from outbox_pipelines.core.errors import ConfigError, OutboxError
from outbox_pipelines.core.listen import is_loopback
from outbox_pipelines.core.redaction import redact_text
from outbox_pipelines.core.settings import Settings, load_settings_or_problem
from outbox_pipelines.defs.links import ui_url as default_ui_url
from outbox_pipelines.oncall_page.dagster_client import DagsterClient
from outbox_pipelines.oncall_page.views import Pages, problem_page

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def check_exposure(host: str, allow_remote: bool) -> None:
    """Refuse (ConfigError) a non-loopback address unless ``allow_remote``: the page has no login and launches runs."""
    if not is_loopback(host) and not allow_remote:
        raise ConfigError(
            f"refusing to serve the on-call page on {host}: it has no login, and anyone who can reach it can "
            "replay and skip dead messages. Serve it on 127.0.0.1 (the default) behind an authenticating proxy, "
            f"or pass --allow-remote to serve it on {host} on purpose"
        )


class _HostGuard:
    """Answer only requests whose Host is a loopback name or one of ``hosts`` (a DNS-rebinding page is refused)."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str] | None) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.hosts is not None:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = (urlsplit(f"//{host}").hostname or "").lower()
            if name not in LOOPBACK_NAMES and name not in self.hosts:
                await HTMLResponse("this page answers on 127.0.0.1 and localhost only", 421)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(
    database_url: str,
    *,
    settings: Settings | Callable[[], Settings] | None = None,
    ui_url: str | None = None,
    hosts: tuple[str, ...] | None = (),
    dagster_url: str | None = None,
) -> Starlette:
    """The on-call page over ``database_url``. ``settings``: the project's (or how to load them; default: read
    outbox.toml at each request, as ``status`` does); ``ui_url``: the Dagster UI it links to and launches through
    (default OUTBOX_UI_URL, else http://127.0.0.1:3000); ``dagster_url``: where it reaches that webserver's API
    when the browser's address is not the page's (a container's ``http://webserver:3000``); ``hosts``: the names
    it answers to besides loopback (None: any, for a page served remotely on purpose)."""
    dagster = DagsterClient(ui_url or default_ui_url(), api_url=dagster_url)

    def current() -> Settings:
        if settings is None:
            return load_settings_or_problem()
        return settings() if callable(settings) else settings

    pages = Pages(database_url, current, dagster)
    routes = [
        Route("/", pages.overview),
        Route("/tables/{name}", pages.table_page),
        Route("/search", pages.search),
        Route("/actions/{action}", pages.act, methods=["POST"]),
        Route("/runs/{run_id}", pages.run_page),
    ]
    app = Starlette(routes=routes, exception_handlers={OutboxError: _outbox_error})
    app.add_middleware(_HostGuard, hosts=None if hosts is None else frozenset(n.lower() for n in hosts))
    return app


async def _outbox_error(request: Request, exc: Exception) -> Response:
    # The database is down, the schema is behind: the core's sentence (no password in it), not a traceback.
    return problem_page(503, "The outbox cannot be read", redact_text(str(exc)))


@dataclass
class RunningPage:
    """An on-call page served from a thread of this process: its address, and how to stop it."""

    url: str
    port: int
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot serve the on-call page on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _server(app: Starlette) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    database_url: str,
    settings: Settings | Callable[[], Settings] | None = None,
    ui_url: str | None = None,
    dagster_url: str | None = None,
    allow_remote: bool = False,
) -> RunningPage:
    """Serve the on-call page from a daemon thread (port 0: a free one; ``RunningPage.url`` says which). Refused
    (ConfigError) on a non-loopback ``host`` unless ``allow_remote``, or when the port is taken."""
    check_exposure(host, allow_remote)
    sock = _listen(host, port)
    hosts = None if allow_remote else ()
    server = _server(build_app(database_url, settings=settings, ui_url=ui_url, dagster_url=dagster_url, hosts=hosts))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="oncall-page", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    bound = sock.getsockname()[1]
    return RunningPage(_url(host, bound), bound, server, thread)


def serve(
    host: str,
    port: int,
    *,
    database_url: str,
    ui_url: str | None = None,
    dagster_url: str | None = None,
    allow_remote: bool = False,
    say: Callable[[str], None] = print,
) -> int:
    """Serve the page in this thread until Ctrl-C (``outbox-pipelines oncall-page``)."""
    check_exposure(host, allow_remote)
    sock = _listen(host, port)
    app = build_app(database_url, ui_url=ui_url, dagster_url=dagster_url, hosts=None if allow_remote else ())
    server = _server(app)
    where, ui = _url(host, sock.getsockname()[1]), dagster_url or ui_url or default_ui_url()
    say(f"outbox on-call page: {where}  (launches runs through the Dagster UI at {ui}; Ctrl-C stops it)")
    server.run(sockets=[sock])
    return 0
