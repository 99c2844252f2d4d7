"""A relay as a least-privilege login against the same relay as the tables' owner, with the audit's check of untold
changes (0018's outbox_record_changes, which the owner skips) as the version before 0026 had it and as it is now.

    .venv/bin/python bench/relay_login.py [--runs 5] [--messages 20000] [--keys 1000]

One embedded server (or OUTBOX_TEST_DATABASE_URL's), one database migrated by this checkout with a table and the
roles of ``db grant``, a login in ``outbox_relay``. Each run, in an order shuffled per run, ``outbox-pipelines relay
--table T --once`` drains ``messages`` rows (loaded untimed, then VACUUM ANALYZE; paper destination, every default)
as: the owner; the login with the check of this checkout; the login with the check before 0026; the login with the
check's triggers disabled (what the check costs at all). Prints msg/s medians [min–max] and per-run ratios.
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
THIS_TREE = HERE.parents[1]
TABLE = "bench_login"
LOGIN = "bench_relay_login"
FILL = (
    f"INSERT INTO {TABLE} (event_id, topic, payload, payload_sha, headers, ordering_key) "
    "SELECT %(tag)s || '-' || n, 'order.created', jsonb_build_object('order', n), 'sha256:' || md5(n::text), "
    "'{}'::jsonb, CASE WHEN %(keys)s > 0 THEN 'k-' || (n %% %(keys)s) END FROM generate_series(1, %(count)s) n"
)
TRIGGERS = ("outbox_audit_mark", "outbox_audit_updates")
VARIANTS = ("owner", "login", "login, check before 0026", "login, no check")


def check_before_0026() -> str:
    """0018's DO block that defines outbox_record_changes, as the version before 0026 ran it."""
    text = (THIS_TREE / "sql" / "migrations" / "0018_row_history.sql").read_text(encoding="utf-8")
    blocks = re.findall(r"DO \$do\$.*?\$do\$;", text, re.S)
    return next(block for block in blocks if "FUNCTION outbox_record_changes()" in block)


def check_now() -> str:
    return (THIS_TREE / "sql" / "migrations" / "0026_untold_changes_linear.sql").read_text(encoding="utf-8")


def drain(url: str, project: str, count: int) -> float:
    env = {**os.environ, "OUTBOX_DATABASE_URL": url, "OUTBOX_CONFIG": str(Path(project, "outbox.toml"))}
    started = time.perf_counter()
    done = subprocess.run(
        [str(THIS_TREE / ".venv" / "bin" / "outbox-pipelines"), "relay", "--table", TABLE, "--once", "--quiet"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"relay failed ({done.returncode}): {done.stderr[-2000:]}")
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=0, help="ordering keys the messages spread over (0: none)")
    args = parser.parse_args()
    sys.path.insert(0, str(THIS_TREE))
    import psycopg
    from psycopg import sql

    from outbox_pipelines.core.storage import migrate, roles
    from outbox_pipelines_tests.scratch import ScratchServer

    server = ScratchServer.from_env("OUTBOX_TEST_DATABASE_URL", dir_prefix="outbox-bench-login-")
    try:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS bench_login")
            admin.execute("CREATE DATABASE bench_login")
        owner_url = psycopg.conninfo.make_conninfo(server.admin_url, dbname="bench_login")
        migrate.upgrade(owner_url)
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("SELECT outbox_create_table(%s)", (TABLE,))
        roles.grant_roles(owner_url)
        password = os.urandom(12).hex()
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(LOGIN)))
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE outbox_relay").format(
                    sql.Identifier(LOGIN), sql.Literal(password)
                )
            )
        login_url = psycopg.conninfo.make_conninfo(owner_url, user=LOGIN, password=password)
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        with tempfile.TemporaryDirectory() as project, psycopg.connect(owner_url, autocommit=True) as conn:
            Path(project, "outbox.toml").write_text(
                f'shipped_tables = false\n[tables.{TABLE}]\ndestination = "paper"\n', encoding="utf-8"
            )
            keys = f" over {args.keys:,} ordering keys" if args.keys else ""
            print(f"{args.messages:,} messages{keys} a drain, {args.runs} runs; load {os.getloadavg()[0]:.2f} at start")
            for run in range(args.runs):
                for variant in random.sample(VARIANTS, len(VARIANTS)):
                    conn.execute(check_before_0026() if "before" in variant else check_now())
                    state = "DISABLE" if variant.endswith("no check") else "ENABLE"
                    for trigger in TRIGGERS:
                        conn.execute(
                            sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(
                                sql.Identifier(TABLE), sql.SQL(state), sql.Identifier(trigger)
                            )
                        )
                    conn.execute(f"TRUNCATE {TABLE}")
                    conn.execute(FILL, {"tag": f"r{run}", "count": args.messages, "keys": args.keys})
                    conn.execute(f"VACUUM ANALYZE {TABLE}")
                    rate = drain(owner_url if variant == "owner" else login_url, project, args.messages)
                    rates[variant].append(rate)
                    print(f"run {run + 1}: {variant}: {rate:,.0f} msg/s", flush=True)
            conn.execute(check_now())
            for trigger in TRIGGERS:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ENABLE TRIGGER {}").format(sql.Identifier(TABLE), sql.Identifier(trigger))
                )
        print("\nmsg/s, median [min–max]")
        for variant, values in rates.items():
            print(f"  {variant:26s} {statistics.median(values):8,.0f} [{min(values):,.0f}–{max(values):,.0f}]")
        print("\nratios of the same runs, median [min–max]")
        for a, b in (
            ("login", "login, no check"),
            ("login, check before 0026", "login, no check"),
            ("login", "login, check before 0026"),
            ("login", "owner"),
        ):
            ratio = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
            print(f"  {a} / {b}: {statistics.median(ratio):.2f} [{min(ratio):.2f}–{max(ratio):.2f}]")
        print(f"load {os.getloadavg()[0]:.2f} at end")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
