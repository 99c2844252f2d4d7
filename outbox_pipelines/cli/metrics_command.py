"""``outbox-pipelines metrics``: the tables' state gauges on a /metrics of their own, read from the database at each
scrape, for tables whose relays serve none (a Dagster run's); and the address ``relay --metrics-port`` listens on.
Names and alert rules: docs/how-to/prometheus.md."""

import argparse
import os
import signal
import threading

from outbox_pipelines.cli.argument_types import bind_host
from outbox_pipelines.cli.inputs import database_url, settings_of
from outbox_pipelines.cli.output import EXIT_OK, UsageError, say
from outbox_pipelines.core.oncall import table_metrics
from outbox_pipelines.core.telemetry import metrics

METRICS_HOST_ENV = "OUTBOX_METRICS_HOST"
DEFAULT_METRICS_HOST = "127.0.0.1"


def metrics_host(given: str | None) -> str:
    """The address /metrics listens on: ``given`` (--host, --metrics-host), else OUTBOX_METRICS_HOST, else loopback."""
    if given:
        return given
    from_env = os.environ.get(METRICS_HOST_ENV, "").strip()
    if not from_env:
        return DEFAULT_METRICS_HOST
    try:
        return bind_host(from_env)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{METRICS_HOST_ENV}: {exc}") from None


def serve_metrics(port: int, host: str) -> str:
    """Serve the process's /metrics on host:port (a thread); the address as a URL."""
    try:
        metrics.serve(port, host)
    except OSError as exc:  # the port is taken, the address is not this machine's
        raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def cmd_metrics(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    names = args.table or sorted([*settings.tables, *settings.without_secrets])  # it reads; it delivers nothing
    tables = [settings.for_operations(name) for name in names]
    if not tables:
        raise UsageError("the project declares no outbox table: name one with --table")
    table_metrics.watch_tables(
        database_url(), [table.name for table in tables], {table.name: table.relay_enabled for table in tables}
    )
    address = serve_metrics(args.port, metrics_host(args.host))
    say(f"the state of {', '.join(table.name for table in tables)} on {address} (Ctrl-C or SIGTERM stops)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    return EXIT_OK
