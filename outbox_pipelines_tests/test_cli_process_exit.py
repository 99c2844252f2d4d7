"""A command-line process ends at once when its command returns (cli/process_exit.py): what it printed is all
there, its exit code is the command's, and atexit's callbacks (logging's, an OpenTelemetry provider's flush, the
application's own) have run. A thread that is not a daemon still running makes it end the usual way."""

import subprocess
import sys

from outbox_pipelines_tests.conftest import run_cli
from outbox_pipelines_tests.helpers import enqueue_n, statuses

# The console script's entry, as pip writes it, with an application's atexit callback registered before it.
ENTRY = (
    "import atexit, sys, threading\n"
    "atexit.register(lambda: print('atexit callback ran'))\n"
    "if sys.argv[1] == 'with-thread':\n"
    "    threading.Thread(target=lambda: (__import__('time').sleep(2), print('thread finished'))).start()\n"
    "sys.argv = ['outbox-pipelines', *sys.argv[2:]]\n"
    "from outbox_pipelines.cli import run\n"
    "run()\n"
)


def entry(cli_env, *args, cwd=None):
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *args], env=cli_env, capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_a_relay_process_ends_with_its_output_its_exit_code_and_its_atexit_callbacks(cli_env, conn, tmp_path):
    (tmp_path / "outbox.toml").write_text('[tables.outbox_events]\ndestination = "paper"\n')
    enqueue_n(conn, "outbox_events", 30)
    done = entry(cli_env, "plain", "relay", "--table", "outbox_events", "--once", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "claimed 30, sent 30" in done.stdout
    assert done.stdout.rstrip().endswith("atexit callback ran")  # after the command's own output
    assert statuses(conn, "outbox_events") == {"sent": 30}
    refused = entry(cli_env, "plain", "relay", "--table", "no_such_table", "--once", cwd=tmp_path)
    assert refused.returncode == 2
    assert "no settings for table 'no_such_table'" in refused.stdout + refused.stderr
    assert refused.stdout.rstrip().endswith("atexit callback ran")


def test_a_thread_still_running_is_waited_for(cli_env):
    done = entry(cli_env, "with-thread", "relay", "--table", "outbox_events", "--once", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-5:] == ["thread", "finished", "atexit", "callback", "ran"]


def test_the_console_script_and_python_dash_m_run_the_same_entry(cli_env):
    result = run_cli(cli_env, "relay", "--table", "outbox_events", "--once")
    assert result.returncode == 0, result.stderr
    assert "claimed 0, sent 0" in result.stdout
