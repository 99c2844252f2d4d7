"""What the database's own audit of row changes costs the relay (issue 42, migrations 0017-0018).

Drains a table as a login in the relay role (``db grant``'s outbox_relay), claim then settle, batches of
100, on two clones of one database: one as migrated, one with the guards' triggers dropped (what the same
statements cost before them). Each run drains both a batch at a time, in turns; per run, each statement's
median time gives rows per second; the figures are the medians over the runs, and of the per-run ratios
guarded / unguarded.

    .venv/bin/python bench/row_history.py --runs 5 --rows 20000
    .venv/bin/python bench/row_history.py --audit failures   # the tables' audit = "failures"

The server is OUTBOX_BENCH_DATABASE_URL's, else an embedded one started (and stopped) here.
"""

import argparse
import os
import statistics
import time
from urllib.parse import urlencode

import psycopg
from psycopg import sql

from outbox_pipelines.core.storage import roles
from outbox_pipelines.core.storage.table import OutboxTable
from outbox_pipelines_tests.scratch import ScratchServer, TemplateDatabases

TABLE = "bench_outbox"
BATCH = 100
GUARDS = ("outbox_audit_mark", "outbox_audit_updates", "outbox_audit_deletes")
VARIANTS = ("guarded", "unguarded")


def _login_url(url: str, login: str) -> str:
    params = {k: v for k, v in psycopg.conninfo.conninfo_to_dict(url).items() if v is not None}
    database = params.pop("dbname")
    params.pop("password", None)
    return f"postgresql:///{database}?" + urlencode({**params, "user": login})


def _fill(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (event_id, topic, payload, payload_sha) "
                "SELECT 'e' || n || '-' || clock_timestamp(), 't', jsonb_build_object('n', n), md5(n::text) "
                "FROM generate_series(1, %s) AS n"
            ).format(sql.Identifier(TABLE)),
            (rows,),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(TABLE)))


def _pair(table: OutboxTable, audit_all: bool) -> tuple[float, float, int]:
    """One claim of a batch and its settle: the seconds of each, and the rows settled."""
    started = time.perf_counter()
    batch = table.claim("bench", BATCH, 60, audit_claims=audit_all, fast_commit=True, reuse_plan=True)
    claimed = time.perf_counter()
    done = table.settle_sent(
        "bench",
        [m.id for m in batch],
        [m.attempts for m in batch],
        audit_code="outbox_flush_sent",
        audit_successes=audit_all,
        fast_commit=True,
    )
    return claimed - started, time.perf_counter() - claimed, len(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--audit", choices=("all", "failures"), default="all")
    args = parser.parse_args()
    server = ScratchServer.from_env("OUTBOX_BENCH_DATABASE_URL", dir_prefix="outbox-bench-history-")
    login = f"bench_relay_{os.getpid()}"
    try:
        databases = TemplateDatabases(server.admin_url, prefix=f"bench_history{os.getpid()}", parts=())
        template = databases.url_for(databases.template)
        with psycopg.connect(template, autocommit=True) as conn:
            conn.execute("SELECT outbox_create_table(%s)", (TABLE,))
        roles.grant_roles(template)
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(sql.Identifier(login), sql.Identifier(roles.RELAY))
            )
        results: dict[str, list[tuple[float, float]]] = {"guarded": [], "unguarded": []}
        for run in range(args.runs):
            tables, names = {}, []
            for variant in VARIANTS:
                name, url = databases.create_database(variant)
                names.append(name)
                if variant == "unguarded":
                    with psycopg.connect(url, autocommit=True) as conn:
                        for trigger in GUARDS:
                            conn.execute(
                                sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(trigger), sql.Identifier(TABLE))
                            )
                        conn.execute("DROP TRIGGER outbox_audit_written ON outbox_audit")
                _fill(url, args.rows)
                tables[variant] = OutboxTable(psycopg.connect(_login_url(url, login), autocommit=True), TABLE)
            # Batch by batch, the two in turns (whose turn first alternates): a load that comes and goes on the
            # machine falls on both alike.
            spent = {variant: ([], []) for variant in VARIANTS}
            for turn in range(args.rows // BATCH):
                for variant in VARIANTS if turn % 2 == 0 else VARIANTS[::-1]:
                    claim_s, settle_s, settled = _pair(tables[variant], args.audit == "all")
                    assert settled == BATCH, (variant, settled)
                    spent[variant][0].append(settle_s)
                    spent[variant][1].append(claim_s)
            for variant in VARIANTS:
                settle_s, claim_s = (statistics.median(times) for times in spent[variant])
                results[variant].append((BATCH / settle_s, BATCH / claim_s))
                tables[variant].conn.close()
            with psycopg.connect(databases.url_for(names[0])) as conn:
                untold = conn.execute(
                    "SELECT count(*) FROM outbox_audit WHERE code = 'outbox_untold_change'"
                ).fetchone()
            print(
                f"run {run + 1}: settle {results['guarded'][-1][0]:.0f} / {results['unguarded'][-1][0]:.0f} rows/s, "
                f"claim {results['guarded'][-1][1]:.0f} / {results['unguarded'][-1][1]:.0f} rows/s (guarded / not); "
                f"audit rows the trigger wrote: {untold[0]}",
                flush=True,
            )
            for name in names:
                databases.drop_database(name)
        for index, what in ((0, "settle"), (1, "claim")):
            guarded = [r[index] for r in results["guarded"]]
            unguarded = [r[index] for r in results["unguarded"]]
            ratios = [g / u for g, u in zip(guarded, unguarded, strict=True)]
            print(
                f"{what} (audit = {args.audit!r}): guarded {statistics.median(guarded):.0f} rows/s "
                f"({min(guarded):.0f}-{max(guarded):.0f}), unguarded {statistics.median(unguarded):.0f} rows/s "
                f"({min(unguarded):.0f}-{max(unguarded):.0f}); ratio median {statistics.median(ratios):.3f} "
                f"({min(ratios):.3f}-{max(ratios):.3f})"
            )
        databases.drop_template()
    finally:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login)))
        server.stop()


if __name__ == "__main__":
    main()
