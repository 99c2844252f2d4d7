#!/usr/bin/env python3
"""Write deploy/grafana/outbox-dashboard.json, the outbox's Grafana dashboard (classic JSON model).

The panels are declared here, once; the JSON is this script's output (a test checks the file equals it), so
edit this script and rerun it rather than the JSON:

    .venv/bin/python deploy/grafana/build_dashboard.py          # --check: exit 1 when the file is stale

Every query reads the metrics a relay's /metrics serves (docs/how-to/grafana.md, "What each panel shows").
Gauges that several processes export (the relay and `outbox-pipelines metrics`) are read with `max by (table)`,
counters and histogram buckets are added up with `sum by (...)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("outbox-dashboard.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
TABLE = 'table=~"$table"'
RATE = "[$__rate_interval]"
WIDTH = 24

Panel = dict[str, Any]


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> dict[str, Any]:
    found: dict[str, Any] = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        found |= {"instant": True, "range": False, "format": "table"}
    else:
        found |= {"range": True}
    return found


def quantiles(histogram: str, by: str, legend: str) -> list[dict[str, Any]]:
    """p50, p95 and p99 of a histogram over the rate interval, one target each."""
    return [
        target(
            f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket{{{TABLE}}}{RATE})))",
            f"{legend} p{int(float(q) * 100)}",
            ref,
        )
        for ref, q in (("A", "0.5"), ("B", "0.95"), ("C", "0.99"))
    ]


def timeseries(
    title: str, description: str, targets: list[dict[str, Any]], *, unit: str = "short", stack: bool = False
) -> Panel:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if stack:
        custom |= {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40}
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "min": 0, "custom": custom}, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def mapping(zero: tuple[str, str], one: tuple[str, str]) -> list[dict[str, Any]]:
    """Grafana's value mapping of a 0/1 gauge: each value's (text, colour)."""
    options = {
        value: {"text": text, "color": color, "index": i}
        for i, (value, (text, color)) in enumerate((("0", zero), ("1", one)))
    }
    return [{"type": "value", "options": options}]


def state_timeline(title: str, description: str, targets: list[dict[str, Any]], mappings: list[Any]) -> Panel:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {"mappings": mappings, "color": {"mode": "thresholds"}, "custom": {"fillOpacity": 70}},
            "overrides": [],
        },
        "options": {"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "legend": {"showLegend": False}},
        "targets": targets,
    }


# The overview table: one instant query per column, merged on the table label.
OVERVIEW = (
    ("A", "Waiting", "max", "outbox_pending_count", "short"),
    ("B", "Oldest waiting", "max", "outbox_oldest_waiting_age_seconds", "s"),
    ("C", "Dead", "max", "outbox_dead_count", "short"),
    ("D", "Blocked keys", "max", "outbox_blocked_keys", "short"),
    ("E", "Relays alive", "max", "outbox_relays_alive", "short"),
    ("F", "Relay enabled", "max", "outbox_relay_enabled", "short"),
    ("G", "Circuit", "max", "outbox_circuit_open", "short"),
    ("H", "State read", "min", "outbox_state_up", "short"),
)
OVERVIEW_MAPPINGS = {
    "Relay enabled": mapping(("off", "orange"), ("on", "green")),
    "Circuit": mapping(("closed", "green"), ("open", "red")),
    "State read": mapping(("failing", "red"), ("ok", "green")),
}
OVERVIEW_RED_ABOVE_ZERO = ("Dead", "Blocked keys")


def overview() -> Panel:
    overrides: list[dict[str, Any]] = []
    for _, column, _, _, unit in OVERVIEW:
        properties: list[dict[str, Any]] = [{"id": "unit", "value": unit}]
        if column in OVERVIEW_MAPPINGS:
            properties += [
                {"id": "mappings", "value": OVERVIEW_MAPPINGS[column]},
                {"id": "custom.cellOptions", "value": {"type": "color-background"}},
            ]
        if column in OVERVIEW_RED_ABOVE_ZERO:
            steps = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
            properties += [
                {"id": "thresholds", "value": {"mode": "absolute", "steps": steps}},
                {"id": "custom.cellOptions", "value": {"type": "color-text"}},
            ]
        overrides.append({"matcher": {"id": "byName", "options": column}, "properties": properties})
    return {
        "type": "table",
        "title": "Tables now",
        "description": "Each outbox table as the database says it is at the last scrape: waiting messages (pending "
        "and retrying), the age of the oldest one, dead messages, ordering keys held behind a dead head, relays "
        "heartbeating for the table, the relay_enabled setting, the destination's circuit breaker, and whether "
        "the exporter could read the table at all.",
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"custom": {"align": "auto"}}, "overrides": overrides},
        "options": {"showHeader": True, "sortBy": [{"displayName": "Waiting", "desc": True}]},
        "targets": [
            target(f"{agg} by (table) ({metric}{{{TABLE}}})", column, ref, instant=True)
            for ref, column, agg, metric, _ in OVERVIEW
        ],
        "transformations": [
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "indexByName": {"table": 0} | {f"Value #{ref}": i + 1 for i, (ref, *_) in enumerate(OVERVIEW)},
                    "renameByName": {"table": "Table"} | {f"Value #{ref}": column for ref, column, *_ in OVERVIEW},
                },
            },
        ],
    }


def settled_by_destination() -> list[dict[str, Any]]:
    """Settled per second by result, labelled with the table's destination kind (outbox_destination_info)."""
    info = f"max by (table, destination) (outbox_destination_info{{{TABLE}}})"
    return [
        target(
            f'sum by (table) (rate(outbox_dispatch_total{{{TABLE}, result="{result}"}}{RATE}))'
            f" * on (table) group_left (destination) {info}",
            f"{{{{table}}}} → {{{{destination}}}} {word}",
            ref,
        )
        for ref, result, word in (("A", "success", "delivered"), ("B", "retry", "retried"), ("C", "dead", "dead"))
    ]


# (row title, [(width, height, panel), ...]): each row's panels laid left to right.
def layout() -> list[tuple[str, list[tuple[int, int, Panel]]]]:
    rate_unit = "suffix: msg/s"
    return [
        ("Tables", [(24, 7, overview())]),
        (
            "Backlog and lag",
            [
                (
                    8,
                    8,
                    timeseries(
                        "Waiting messages",
                        "Messages pending or retrying, and those held by a relay right now (in flight).",
                        [
                            target(f"max by (table) (outbox_pending_count{{{TABLE}}})", "{{table}} waiting", "A"),
                            target(f"max by (table) (outbox_locked_count{{{TABLE}}})", "{{table}} in flight", "B"),
                        ],
                    ),
                ),
                (
                    8,
                    8,
                    timeseries(
                        "Oldest waiting message",
                        "Age of the oldest message not yet delivered (0 when none waits): the alert OutboxOldestTooOld "
                        "reads it.",
                        [target(f"max by (table) (outbox_oldest_waiting_age_seconds{{{TABLE}}})", "{{table}}")],
                        unit="s",
                    ),
                ),
                (
                    8,
                    8,
                    timeseries(
                        "Lag, created → delivered (last hour)",
                        "Quantiles over the last hour of the time from a message's creation to its delivery, waiting "
                        "messages counted with their age so far (read from the table at each scrape).",
                        [
                            target(
                                f"max by (table, quantile) (outbox_lag_seconds{{{TABLE}}})", "{{table}} q{{quantile}}"
                            )
                        ],
                        unit="s",
                    ),
                ),
            ],
        ),
        (
            "Throughput",
            [
                (
                    12,
                    8,
                    timeseries(
                        "Settled by result",
                        "Messages settled per second by each table's relays: success, retry, dead, dedup, "
                        "conflict_processed (the destination had it already), conflict (lease lost).",
                        [
                            target(
                                f"sum by (table, result) (rate(outbox_dispatch_total{{{TABLE}}}{RATE}))",
                                "{{table}} {{result}}",
                            )
                        ],
                        unit=rate_unit,
                        stack=True,
                    ),
                ),
                (
                    12,
                    8,
                    timeseries(
                        "Delivered, retried, dead by destination",
                        "The same rates for delivered, retried and dead messages, labelled with the kind of "
                        "destination the table delivers to (http, kafka, rabbitmq, nats, handlers, paper).",
                        settled_by_destination(),
                        unit=rate_unit,
                    ),
                ),
            ],
        ),
        (
            "Latency",
            [
                (
                    12,
                    8,
                    timeseries(
                        "Delivery latency, created → sent",
                        "Percentiles of the time from a message's creation (its transaction's start, not its "
                        "commit) to the relay settling it as sent, from the histogram outbox_delivery_latency_seconds.",
                        quantiles("outbox_delivery_latency_seconds", "table", "{{table}}"),
                        unit="s",
                    ),
                ),
                (
                    12,
                    8,
                    timeseries(
                        "Time in the relay, claim → settled (p95)",
                        "The 95th percentile of the time from a message's claim to its settle, by result "
                        "(outbox_dispatch_latency_seconds): the destination's share of the delivery latency.",
                        [
                            target(
                                "histogram_quantile(0.95, sum by (le, table, result) "
                                f"(rate(outbox_dispatch_latency_seconds_bucket{{{TABLE}}}{RATE})))",
                                "{{table}} {{result}}",
                            )
                        ],
                        unit="s",
                    ),
                ),
            ],
        ),
        (
            "Dead letters",
            [
                (
                    12,
                    8,
                    timeseries(
                        "Dead messages and blocked keys in the table",
                        "Dead messages in the table now (replay or purge lowers it), and ordering keys held behind a "
                        "dead head.",
                        [
                            target(f"max by (table) (outbox_dead_count{{{TABLE}}})", "{{table}} dead", "A"),
                            target(f"max by (table) (outbox_blocked_keys{{{TABLE}}})", "{{table}} blocked keys", "B"),
                        ],
                    ),
                ),
                (
                    12,
                    8,
                    timeseries(
                        "New dead letters by topic",
                        "Messages that went to dead in each interval, by topic.",
                        [
                            target(
                                f"sum by (table, topic) (increase(outbox_dead_total{{{TABLE}}}{RATE}))",
                                "{{table}} {{topic}}",
                            )
                        ],
                        stack=True,
                    ),
                ),
            ],
        ),
        (
            "Destinations and relays",
            [
                (
                    8,
                    8,
                    state_timeline(
                        "Circuit breaker",
                        "Open while the table's destination circuit breaker holds deliveries back.",
                        [target(f"max by (table) (outbox_circuit_open{{{TABLE}}})", "{{table}}")],
                        mapping(("closed", "green"), ("open", "red")),
                    ),
                ),
                (
                    8,
                    8,
                    timeseries(
                        "Paused by the destination (429)",
                        "How much longer the destination asked the table to hold off.",
                        [target(f"max by (table) (outbox_paused_seconds{{{TABLE}}})", "{{table}}")],
                        unit="s",
                    ),
                ),
                (
                    8,
                    8,
                    timeseries(
                        "Relays alive",
                        "Relays heartbeating for each table (outbox_relay_workers, a beat in the last 60 s).",
                        [target(f"max by (table) (outbox_relays_alive{{{TABLE}}})", "{{table}}")],
                    ),
                ),
            ],
        ),
        (
            "Relay statements",
            [
                (
                    12,
                    8,
                    timeseries(
                        "Claim duration",
                        "How long one claim statement takes (outbox_claim_duration_seconds).",
                        quantiles("outbox_claim_duration_seconds", "table", "{{table}}"),
                        unit="s",
                    ),
                ),
                (
                    12,
                    8,
                    timeseries(
                        "Settle duration",
                        "How long one batch's settle takes (outbox_settle_duration_seconds).",
                        quantiles("outbox_settle_duration_seconds", "table", "{{table}}"),
                        unit="s",
                    ),
                ),
            ],
        ),
    ]


def panels() -> list[Panel]:
    placed: list[Panel] = []
    y = 0
    for title, row in layout():
        placed.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
            }
        )
        y += 1
        x, height = 0, 0
        for width, h, panel in row:
            placed.append(panel | {"gridPos": {"h": h, "w": width, "x": x, "y": y}})
            x, height = x + width, max(height, h)
        assert x <= WIDTH, f"row {title!r} is {x} columns wide"
        y += height
    return [{"id": i, **panel} for i, panel in enumerate(placed, start=1)]


def templating() -> list[dict[str, Any]]:
    return [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Prometheus",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        {
            "type": "query",
            "name": "table",
            "label": "Table",
            "datasource": DATASOURCE,
            "definition": "label_values(outbox_pending_count, table)",
            "query": "label_values(outbox_pending_count, table)",
            "refresh": 2,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "current": {},
            "sort": 1,
            "regex": "",
            "hide": 0,
            "options": [],
        },
    ]


def dashboard() -> dict[str, Any]:
    return {
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "state-timeline", "name": "State timeline", "version": ""},
            {"type": "panel", "id": "table", "name": "Table", "version": ""},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
        ],
        "id": None,
        "uid": "outbox-pipelines",
        "title": "Outbox",
        "description": "outbox_pipelines: tables, lag, throughput, latency, dead letters and destinations, from the "
        "metrics of the relays' /metrics (docs/how-to/grafana.md).",
        "tags": ["outbox", "outbox_pipelines", "postgresql"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": templating()},
        "panels": panels(),
    }


def rendered() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the JSON file differs from this script's")
    args = parser.parse_args(argv)
    text = rendered()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: rerun {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
