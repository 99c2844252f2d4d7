"""``outbox-pipelines enqueue``: one message into an outbox table, in its own transaction. Bad input (the
core's ``check_message``, an unknown topic on a table of handlers) exits 2 before the database is reached."""

import argparse
import json
import sys
from typing import Any

from outbox_pipelines.cli.inputs import database_url, settings_of
from outbox_pipelines.cli.output import EXIT_OK, UsageError
from outbox_pipelines.core.destinations.wiring import load_registry
from outbox_pipelines.core.enqueue import Outbox
from outbox_pipelines.core.models import Message
from outbox_pipelines.core.prepare import check_message
from outbox_pipelines.core.storage import db


def read_payload(raw: str) -> str:
    """--payload: the JSON itself, @file.json, or - for stdin."""
    if raw == "-":
        return sys.stdin.read()
    if raw.startswith("@"):
        try:
            with open(raw[1:], encoding="utf-8") as handle:
                return handle.read()
        except OSError as exc:
            raise UsageError(f"cannot read payload file {raw[1:]}: {exc.strerror}") from None
    return raw


def cmd_enqueue(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    table = settings.for_operations(args.table)  # a producer needs no destination credential
    headers: dict[str, Any] = {}
    for item in args.header or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header {item!r}: write it as key=value")
        headers[key] = value
    if args.trace_id:
        headers["trace_id"] = args.trace_id
    message = Message(
        topic=args.topic,
        payload=read_payload(args.payload),
        event_id=args.event_id,
        tenant_id=args.tenant,
        headers=headers,
        ordering_key=args.ordering_key,
    )
    check_message(message)  # bad input exits 2 before the database is even reached
    if table.destination == "handlers" and not args.allow_unknown_topic:
        registry = load_registry(table.handlers or "")
        if not registry.handlers_for(args.topic):
            known = ", ".join(registry.topics) or "none"
            raise UsageError(
                f"no handler for topic {args.topic!r} on {table.name} (known topics: {known}); "
                "nothing was enqueued. Pass --allow-unknown-topic to enqueue it anyway."
            )
    url = database_url()
    with db.connect(url, autocommit=False) as conn:
        result = Outbox(table.name).enqueue(conn, message)
        conn.commit()
    if args.json:
        print(
            json.dumps(
                {
                    "id": result.id,
                    "event_id": result.event_id,
                    "duplicate": result.duplicate,
                    "same_payload": result.same_payload,
                }
            )
        )
    elif result.duplicate:
        note = "" if result.same_payload else " (the stored payload differs from this one; it was kept)"
        print(f"duplicate: event {result.event_id} is already row {result.id} in {table.name}{note}")
    else:
        print(f"enqueued row {result.id} (event {result.event_id}) in {table.name}")
    return EXIT_OK
