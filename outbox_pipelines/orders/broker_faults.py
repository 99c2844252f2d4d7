"""The broker simulator's faults and options, apart from its server: the CLI builds its parser from
them without importing aiohttp (a relay process starts faster for it)."""

import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Any

from outbox_pipelines.core.settings.arguments import bind_host, duration, server_port, whole_number

CONTROL_HELP = """\
control endpoints (not orders; any other path is an order):
  GET  /_stats     JSON: requests (orders received), executed (keys executed, each once),
                   repeats (requests for a key already executed: duplicate deliveries),
                   keys_repeated, answers by kind (201, 409, 400, 429, 503, dropped, hung),
                   started_at / first_request_at / first_executed_at / last_request_at
                   (Unix time), and the current faults
  GET  /_executed  JSON {"keys": [...]}: every key executed
  POST /_faults    JSON object of fault fields to change at runtime, e.g.
                   {"every_nth_429": 0} or {"every_nth_5xx": 10, "hang_s": 3};
                   answers the faults now in force (400 for an unknown field)
"""


@dataclass
class Faults:
    # The first N attempts of every key answer 503.
    fail_first: int = 0
    # Keys answered 503 on their first N attempts (per key).
    flaky_keys: dict[str, int] = field(default_factory=dict)
    # Keys answered 429 with Retry-After (seconds) on their first attempt.
    rate_limited_keys: dict[str, float] = field(default_factory=dict)
    # Keys answered 400 (invalid order) every time.
    bad_keys: set[str] = field(default_factory=set)
    # Every Nth request (1-based, over all keys) gets the fault; 0 = never.
    every_nth_5xx: int = 0
    every_nth_429: int = 0
    retry_after_s: float = 1.0
    every_nth_timeout: int = 0
    hang_s: float = 10.0
    every_nth_drop: int = 0

    def describe(self) -> str:
        parts = [
            f"{name}={value}" for name, value in vars(self).items() if value and name not in ("retry_after_s", "hang_s")
        ]
        return ", ".join(parts) or "none"

    def as_json(self) -> dict[str, Any]:
        data = dict(vars(self))
        data["bad_keys"] = sorted(self.bad_keys)
        return data

    def update(self, changes: dict[str, Any]) -> None:
        """Change some fields (from JSON); ValueError names an unknown field or a wrong type."""
        known = {f.name: f for f in fields(self)}
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ValueError(f"unknown fault fields {unknown}; known: {sorted(known)}")
        converted: dict[str, Any] = {}
        for name, value in changes.items():
            current = getattr(self, name)
            try:
                if isinstance(current, bool) or value is None:
                    raise TypeError
                if isinstance(current, int):
                    converted[name] = int(value)
                elif isinstance(current, float):
                    converted[name] = float(value)
                elif isinstance(current, set):
                    converted[name] = {str(v) for v in value}
                elif isinstance(current, dict):
                    cast = int if name == "flaky_keys" else float
                    converted[name] = {str(k): cast(v) for k, v in dict(value).items()}
                else:
                    converted[name] = value
            except (TypeError, ValueError):
                raise ValueError(f"fault field {name}: cannot use {value!r}") from None
            numbers = converted[name].values() if isinstance(converted[name], dict) else [converted[name]]
            if any(isinstance(n, int | float) and not 0 <= n < math.inf for n in numbers):
                # As the command line's options: a count or a number of seconds, at least 0 (0 = never).
                raise ValueError(f"fault field {name}: {value!r} is not a number at least 0")
        for name, value in converted.items():
            setattr(self, name, value)


def add_fault_options(p: argparse.ArgumentParser) -> None:
    count = whole_number(0)
    p.add_argument("--host", type=bind_host, default="127.0.0.1")
    p.add_argument("--port", type=server_port, default=8700)
    p.add_argument(
        "--fail-first", type=count, default=0, metavar="N", help="answer 503 to the first N attempts of every key"
    )
    p.add_argument("--every-nth-5xx", type=count, default=0, metavar="N", help="answer 503 to every Nth request")
    p.add_argument("--every-nth-429", type=count, default=0, metavar="N", help="answer 429 to every Nth request")
    p.add_argument(
        "--retry-after", type=duration, default=1.0, metavar="S", help="Retry-After of the 429 answers (seconds)"
    )
    p.add_argument(
        "--every-nth-timeout",
        type=count,
        default=0,
        metavar="N",
        help="hang on every Nth request (then execute it: a late answer)",
    )
    p.add_argument("--hang", type=duration, default=10.0, metavar="S", help="how long a hanging request hangs")
    p.add_argument(
        "--every-nth-drop",
        type=count,
        default=0,
        metavar="N",
        help="drop the connection of every Nth request (nothing executed)",
    )
    p.add_argument("--bad-key", action="append", metavar="KEY", help="answer 400 for this idempotency key (repeatable)")


def faults_from_args(args: argparse.Namespace) -> Faults:
    return Faults(
        fail_first=args.fail_first,
        bad_keys=set(args.bad_key or []),
        every_nth_5xx=args.every_nth_5xx,
        every_nth_429=args.every_nth_429,
        retry_after_s=args.retry_after,
        every_nth_timeout=args.every_nth_timeout,
        hang_s=args.hang,
        every_nth_drop=args.every_nth_drop,
    )
