"""The long-running servers and the showcase: ``order-api`` (the order wing's HTTP API), ``broker-sim`` (a local
broker with fault injection), ``dev`` (the Dagster UI and daemon), ``oncall-page`` (the on-call page) and ``demo``.

Each imports its stack (Starlette, aiohttp, Dagster) inside its command: a relay or a status starts without them.
"""

import argparse

from outbox_pipelines.cli.inputs import database_url, settings_of
from outbox_pipelines.cli.output import EXIT_OK, UsageError, say
from outbox_pipelines.core.errors import MigrationError
from outbox_pipelines.core.operations import upgrade
from outbox_pipelines.core.storage import migrate
from outbox_pipelines.orders.broker_faults import faults_from_args

# The order product's part (pyproject.toml, entry points "outbox_pipelines.parts"): the Order API needs it declared.
ORDERS_PART = "orders"


def cmd_demo(args: argparse.Namespace) -> int:
    from outbox_pipelines.demo.data import prepare_demo
    from outbox_pipelines.demo.run import run_demo  # Dagster: only for this command

    # Unlike every other command, the demo runs outside any project too: its data then goes to a directory of
    # the user's (the line it prints says where).
    data = prepare_demo(reset=args.reset)
    print(data.said, flush=True)
    return run_demo(data.url, quiet=args.quiet, data_env=data.data_env)


def cmd_order_api(args: argparse.Namespace) -> int:
    # Imported here: the API's server stack (Starlette, uvicorn, tracing) adds ~0.2 s to every command.
    from outbox_pipelines.orders.api.server import prepare, serve

    settings = settings_of(args)
    if ORDERS_PART not in settings.parts:
        raise UsageError(
            f"the Order API is the order product's, which this project does not declare "
            f'({settings.source or "no outbox.toml"}): add parts = ["{ORDERS_PART}"] to outbox.toml '
            "(its outbox_orders table is then relayed too) and run it again"
        )
    url = database_url(schema_checked=False)  # checked below, after --upgrade
    prepare(url, args.host, allow_anonymous=args.allow_anonymous)  # a refused start touches nothing
    if args.upgrade:  # the deployment asked for it (upgrading at every start is not done silently)
        applied = upgrade.upgrade_project(url, settings, said=say).applied
        if applied:
            say(f"migrated the database: {', '.join(applied)}")
    elif pending := migrate.pending(url, parts=settings.parts):
        raise MigrationError(
            f"the database lacks {', '.join(pending)}, which this version of the Order API needs: run "
            "'outbox-pipelines db upgrade' (or start it with --upgrade)"
        )
    return serve(url, args.host, args.port, allow_anonymous=args.allow_anonymous, say=say)


def cmd_broker_sim(args: argparse.Namespace) -> int:
    from aiohttp import web  # the server stack: only for this command, so a relay starts faster

    from outbox_pipelines.orders.broker_sim import BrokerSim

    faults = faults_from_args(args)
    sim = BrokerSim(faults, host=args.host, port=args.port)
    banner = (
        f"broker simulator on http://{args.host}:{args.port}/orders (any path works; Ctrl-C stops it); "
        f"faults: {faults.describe()}"
    )
    try:  # the banner once listening (aiohttp calls `print` then): never before a bind error
        web.run_app(sim.app(), host=args.host, port=args.port, print=lambda *_: say(banner), access_log=None)
    except OSError as exc:  # the port is taken, the address is not this machine's: the operator's to change
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return EXIT_OK


def cmd_dev(args: argparse.Namespace) -> int:
    from outbox_pipelines.dev import run_dev  # Dagster: only for this command

    return run_dev(
        host=args.host,
        port=args.port,
        allow_remote=args.allow_remote,
        verbose=args.verbose,
        oncall_port=args.oncall_port,
    )


def cmd_oncall_page(args: argparse.Namespace) -> int:
    from outbox_pipelines.oncall_page import serve  # Starlette and uvicorn: only for this command

    settings_of(args)  # the project's root on sys.path, as for status (the page reads outbox.toml at each request)
    return serve(
        args.host,
        args.port,
        database_url=database_url(),
        dagster_url=args.dagster_url,
        allow_remote=args.allow_remote,
        say=say,
    )
