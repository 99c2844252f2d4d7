"""Every bad value an operator or a setting gives the command line is refused with exit 2 and a sentence, never a
traceback (issue 42, point 6): the sweep below runs each command with values out of bounds (a duration of
``nan`` or 99999999 days, a port of 99999, 2**70 messages, a reason holding a terminal escape, a variable that
is not a number, a settings key out of bounds) and asserts what a user sees: exit 2, an ``error:`` line, no
``Traceback``, nothing written."""

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import statuses

TABLE = "sweep_outbox"
SECTION = f'[tables.{TABLE}]\ndestination = "paper"\nmode = "competing"\n'
ENQUEUE = ["enqueue", "--table", TABLE, "--topic", "invoice.paid", "--payload", "{}"]
HUGE = str(2**70)

# (argv, environment, extra lines of the table's section, what the error names)
CASES: list[tuple[list[str], dict[str, str], str, str]] = [
    # the relay's budgets, sizes and port
    (["relay", "--table", TABLE, "--max-seconds", "nan"], {}, "", "--max-seconds"),
    (["relay", "--table", TABLE, "--max-seconds", "inf"], {}, "", "--max-seconds"),
    (["relay", "--table", TABLE, "--max-seconds", "-1"], {}, "", "--max-seconds"),
    (["relay", "--table", TABLE, "--max-seconds", "1e999"], {}, "", "--max-seconds"),
    (["relay", "--table", TABLE, "--max-seconds", "99999999999d"], {}, "", "longer than 36500d"),
    (["relay", "--group", "default", "--max-seconds", "nan"], {}, "", "--max-seconds"),
    (["relay", "--table", TABLE, "--metrics-port", "99999"], {}, "", "from 1 to 65535"),
    (["relay", "--table", TABLE, "--metrics-port", "0"], {}, "", "from 1 to 65535"),
    (["relay", "--table", TABLE, "--metrics-port", "http"], {}, "", "not a whole number"),
    (["relay", "--table", TABLE, "--batch-size", "0"], {}, "", "--batch-size"),
    (["relay", "--table", TABLE, "--batch-size", HUGE], {}, "", "--batch-size"),
    (["relay", "--table", TABLE, "--max-entries", "-1"], {}, "", "--max-entries"),
    (["relay", "--table", TABLE, "--max-entries", HUGE], {}, "", "--max-entries"),
    (["relay", "--table", TABLE, "--once", "--worker-id", "w\x1b]0;pwned\x07"], {}, "", "U+001B"),
    # replay's times and ids
    (["replay", "--table", TABLE, "--since", "99999999d"], {}, "", "further back than 36500d"),
    (["replay", "--table", TABLE, "--until", "99999999w"], {}, "", "further back than 36500d"),
    (["replay", "--table", TABLE, "--since", "1" + "0" * 400 + "d"], {}, "", "further back than 36500d"),
    (["replay", "--table", TABLE, "--since", "9999-12-31T23:00-05:00"], {}, "", "is not a time"),
    (["replay", "--table", TABLE, "--id", HUGE], {}, "", "does not fit a row id"),
    # skip: an id out of range, a reason that is not one printable line
    (["skip", "--table", TABLE, "--id", HUGE], {}, "", "does not fit a row id"),
    (["skip", "--table", TABLE, "--id", "1", "--reason", "\x1b[31mred\x1b[0m"], {}, "", "U+001B"),
    (["skip", "--table", TABLE, "--id", "1", "--reason", "two\nlines"], {}, "", "U+000A"),
    (["skip", "--table", TABLE, "--id", "1", "--reason", "c1 \x9b31m"], {}, "", "U+009B"),
    (["skip", "--table", TABLE, "--id", "1", "--reason", "x" * 5000], {}, "", "at most 1000"),
    # maintenance durations
    (["requeue-stuck", "--threshold", "99999999999d"], {}, "", "--threshold"),
    (["requeue-stuck", "--threshold", "nan"], {}, "", "--threshold"),
    (["clean", "--retention", "1" + "0" * 400 + "d"], {}, "", "--retention"),
    (["clean", "--audit-retention", "-1d"], {}, "", "--audit-retention"),
    # the servers' ports and the broker simulator's faults
    (["order-api", "--port", "99999"], {}, "", "--port"),
    (["dev", "--port", "-1"], {}, "", "--port"),
    (["broker-sim", "--port", "70000"], {}, "", "--port"),
    (["broker-sim", "--hang", "inf"], {}, "", "--hang"),
    (["broker-sim", "--fail-first", "-1"], {}, "", "--fail-first"),
    # variables that are not numbers, or out of bounds
    (ENQUEUE, {"OUTBOX_MAX_PAYLOAD_BYTES": "abc"}, "", "OUTBOX_MAX_PAYLOAD_BYTES='abc' is not a whole number"),
    (ENQUEUE, {"OUTBOX_MAX_PAYLOAD_BYTES": HUGE}, "", "OUTBOX_MAX_PAYLOAD_BYTES"),
    (ENQUEUE, {"OUTBOX_MAX_PAYLOAD_BYTES": "-5"}, "", "OUTBOX_MAX_PAYLOAD_BYTES"),
    (["relay", "--table", TABLE, "--once"], {"OUTBOX_BATCH_SIZE": HUGE}, "", "OUTBOX_BATCH_SIZE"),
    (["status"], {"OUTBOX_RELAY_LOCK_TTL": "99999999999d"}, "", "OUTBOX_RELAY_LOCK_TTL"),
    (["clean"], {"OUTBOX_CLEANER_RETENTION": "nan"}, "", "OUTBOX_CLEANER_RETENTION"),
    (["requeue-stuck"], {"OUTBOX_STUCK_THRESHOLD_MIN": "99999999999"}, "", "OUTBOX_STUCK_THRESHOLD_MIN"),
    (["status"], {"OUTBOX_IDLE_SLEEP_MS": HUGE}, "", "OUTBOX_IDLE_SLEEP_MS"),
    # a table's settings out of bounds (TOML reads nan, inf and negative numbers as numbers)
    (["relay", "--table", TABLE, "--once"], {}, "lease = nan\n", "lease must be a duration"),
    (["relay", "--table", TABLE, "--once"], {}, "timeout = inf\n", "timeout must be a duration"),
    (["relay", "--table", TABLE, "--once"], {}, 'retention = "99999999999d"\n', "longer than 36500d"),
    (["relay", "--table", TABLE, "--once"], {}, "batch_size = -5\n", "batch_size must be a whole number"),
    (["relay", "--table", TABLE, "--once"], {}, "batch_size = 9223372036854775807\n", "batch_size"),
    (ENQUEUE, {}, "concurrency = 0\n", "concurrency must be a whole number"),
    # a message that cannot be one
    (["enqueue", "--table", TABLE, "--topic", "t", "--payload", '{"a": NaN}'], {}, "", "payload"),
    (["enqueue", "--table", TABLE, "--topic", "t", "--payload", "[1e999]"], {}, "", "payload"),
    # files and addresses that cannot be used
    (["--config", "{binary}", "status"], {}, "", "cannot be read as a settings file"),
    (["init", "--example-project", "/dev/null/project"], {}, "", "cannot copy the example project"),
    (["broker-sim", "--host", "999.1.1.1"], {}, "", "not an address to listen on"),
    # names
    (["status", "--table", "Bad-Name"], {}, "", "Bad-Name"),
    (["db", "create-table", "Bad Name"], {}, "", "Bad Name"),
    (["init", "--table", "Bad Name"], {}, "", "Bad Name"),
]


def project(root: Path, extra: str = "") -> Path:
    """A project of its own for one case: its pyproject.toml and outbox.toml (the table's section, plus ``extra``)."""
    directory = root / f"case-{len(list(root.iterdir()))}"
    directory.mkdir()
    (directory / "pyproject.toml").write_text('[project]\nname = "sweep"\nversion = "0.1.0"\n')
    (directory / "outbox.toml").write_text(SECTION + extra)
    return directory


def refusal_problem(cli_env: dict[str, str], cwd: Path, case: tuple[list[str], dict[str, str], str, str]) -> str | None:
    """What is wrong with how the command refused the case (None: exit 2, an error line naming it, no traceback)."""
    argv, environment, extra, named = case
    argv = [arg.replace("{binary}", str(cwd / "binary.toml")) for arg in argv]
    (cwd / "binary.toml").write_bytes(b"\xff\xfe\x00\x88 not text")
    shown = [arg if len(arg) < 40 else f"{arg[:12]}...({len(arg)} characters)" for arg in argv]
    try:  # a refusal comes at once; a relay given a budget of nan would run for good (killed at the timeout)
        result = run_cli({**cli_env, **environment}, *argv, cwd=cwd, timeout=30)
    except subprocess.TimeoutExpired:
        return f"{shown} {environment} {extra!r}: still running after 30 s"
    said = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
    if result.returncode != 2 or "Traceback" in result.stderr or "error:" not in said or named not in result.stderr:
        return f"{shown} {environment} {extra!r}: exit {result.returncode}\n{result.stderr[-600:]}"
    return None


def test_every_command_refuses_bad_values_with_exit_2_and_a_sentence(cli_env, conn, tmp_path):
    root = tmp_path / "sweep"
    root.mkdir()
    created = run_cli(cli_env, "db", "create-table", TABLE, cwd=project(root))
    assert created.returncode == 0, created.stderr
    # init writes the project's first outbox.toml: its case runs where there is none yet.
    cwds = [tmp_path / "empty" if argv[0] == "init" else project(root, extra) for argv, _, extra, _ in CASES]
    (tmp_path / "empty").mkdir()

    with ThreadPoolExecutor(max_workers=4) as pool:  # each case is a process of its own, waiting on I/O mostly
        problems = list(pool.map(lambda case, cwd: refusal_problem(cli_env, cwd, case), CASES, cwds))

    wrong = [problem for problem in problems if problem is not None]
    assert wrong == [], "\n\n".join(wrong)
    assert statuses(conn, TABLE) == {}  # nothing was written
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["binary.toml"]  # init wrote nothing
    for directory in root.iterdir():
        assert {p.name for p in directory.iterdir()} - {"binary.toml"} == {"outbox.toml", "pyproject.toml"}
