"""Serving the Order API from the command line (``outbox-pipelines order-api``).

``serve`` refuses (exit 2) to serve without OUTBOX_API_TOKEN beyond loopback unless ``allow_anonymous``; open on
loopback it logs one WARNING line. It turns on the per-request log line and OTLP export when OTEL_* asks.
"""

import logging
from collections.abc import Callable

import uvicorn

from outbox_pipelines.orders.api import tracing
from outbox_pipelines.orders.api.app import ApiSettings, create_app
from outbox_pipelines.orders.api.auth import check_exposure

log = logging.getLogger("outbox_pipelines.orders.api")


def prepare(database_url: str, host: str, *, allow_anonymous: bool = False) -> ApiSettings:
    """The settings from the environment, checked against where the API is to listen (ConfigError if refused)."""
    settings = ApiSettings.from_env(database_url)
    warning = check_exposure(host, bool(settings.tokens), allow_anonymous)
    if warning:
        log.warning(warning)
    return settings


def serve(
    database_url: str, host: str, port: int, *, allow_anonymous: bool = False, say: Callable[[str], None] = print
) -> int:
    settings = prepare(database_url, host, allow_anonymous=allow_anonymous)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)  # the request lines; the root handler (if any) prints them
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    provider = tracing.configure_from_env()
    app = create_app(settings)
    auth = f"bearer tokens: {len(settings.tokens)}" if settings.tokens else "open, no token"
    metrics_auth = "token required" if settings.metrics_protected else "open"
    say(
        f"Order API on http://{host}:{port}/do/order ({auth}; {settings.rate_per_minute}/min per client; "
        f"/metrics {metrics_auth}; tracing {'OTLP export' if provider else 'off'}); OpenAPI at /openapi.json"
    )
    try:
        # proxy_headers=False: uvicorn would otherwise take the client address from X-Forwarded-For
        # (it trusts 127.0.0.1), letting any local caller dodge the rate limits; the app decides
        # which proxies to believe (OUTBOX_TRUSTED_PROXIES).
        uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, proxy_headers=False)
    finally:
        if provider is not None:
            provider.shutdown()
    return 0
