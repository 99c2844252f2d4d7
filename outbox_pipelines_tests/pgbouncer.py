"""A real PgBouncer (Debian's package) in transaction pooling mode in front of a test database.

Started by the tests that need it and stopped by its process id. PgBouncer refuses to run as
root: as root it runs as the owner of the embedded server's socket directory (which only that
user may enter), or as ``nobody`` in front of a server reached over TCP.
"""

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from outbox_pipelines_tests.processes import free_port, stop_process

INSTALL_HINT = (
    "pgbouncer is not installed: `apt-get install pgbouncer` (Debian/Ubuntu), or run `bash .ci/run`, "
    "which installs it where it is missing"
)


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or next(
        (str(p) for p in (Path("/usr/sbin/pgbouncer"), Path("/usr/bin/pgbouncer")) if p.exists()), None
    )
    if found is None:
        raise RuntimeError(INSTALL_HINT)
    return found


def _run_as(server_host: str) -> list[str]:
    if os.geteuid() != 0:
        return []
    if server_host.startswith("/"):
        return ["-u", pwd.getpwuid(os.stat(server_host).st_uid).pw_name]
    return ["-u", "nobody"]


class PgBouncer:
    """``url`` reaches ``database_url``'s database through the pooler (any user name, no password)."""

    def __init__(self, database_url: str, *, pool_size: int = 2) -> None:
        server = conninfo_to_dict(database_url)
        self.dir = Path(tempfile.mkdtemp(prefix="outbox-pgbouncer-"))
        self.port = free_port()
        target = " ".join(
            f"{key}={value}"
            for key, value in (
                ("host", server.get("host", "127.0.0.1")),
                ("port", server.get("port", "5432")),
                ("dbname", server["dbname"]),
                ("user", server.get("user", "postgres")),
                ("password", server.get("password")),
            )
            if value
        )
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"outbox = {target}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 200\n"
            # Clients reconnect at once in the tests: no grace period for a server connection to come back.
            "server_login_retry = 1\n"
        )
        # PgBouncer reads its configuration after it gave up root.
        self.dir.chmod(0o755)
        (self.dir / "pgbouncer.ini").chmod(0o644)
        self.url = f"postgresql://outbox@127.0.0.1:{self.port}/outbox"
        self.log_path = self.dir / "pgbouncer.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [pgbouncer_binary(), *_run_as(str(server.get("host", ""))), str(self.dir / "pgbouncer.ini")],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_until_ready()

    def _wait_until_ready(self, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}: {self.log()}")
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not answer within {timeout_s}s: {self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        stop_process(self.process, grace_s=10)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
