"""Where the demo keeps its data (``prepare_demo``): the project's ``.outbox/`` inside a project; anywhere else (an
empty directory, after ``pip install outbox_pipelines``) a directory of the user's,
``$XDG_DATA_HOME/outbox-pipelines/demo`` (default ``~/.local/share/outbox-pipelines/demo``), reused by the next
run and removed by ``demo --reset``."""

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage import db, project_dir

# Under $XDG_DATA_HOME (default ~/.local/share): the demo's data when it runs outside any project.
USER_DEMO_DIR = ("outbox-pipelines", "demo")


@dataclass(frozen=True)
class DemoData:
    url: str
    directory: Path  # the embedded server's data (unless OUTBOX_DATABASE_URL), Dagster's home, the mail
    said: str  # the one line telling where that is
    # Outside any project the other commands find the demo's data by OUTBOX_EMBEDDED_DIR: "NAME=value" to
    # export before the commands the demo suggests at the end ("" inside a project).
    data_env: str = ""


def user_demo_dir() -> Path:
    """The demo's data outside any project: $XDG_DATA_HOME/outbox-pipelines/demo, else ~/.local/share/…"""
    return project_dir.user_data_dir(*USER_DEMO_DIR)


def prepare_demo(reset: bool = False) -> DemoData:
    """Choose where the demo keeps its data, reset it if asked, and start (or reuse) its database.

    OUTBOX_EMBEDDED_DIR when set; inside a project its ``.outbox/`` (shared with ``dev``); anywhere else the
    per-user directory, named in OUTBOX_EMBEDDED_DIR for the rest of this process so that the server, Dagster's
    home and the example mailer all write there. ``reset`` removes the per-user directory only: a project's
    ``.outbox/`` and a database of yours hold more than the demo's data.
    """
    url_set = bool(os.environ.get(db.DATABASE_URL_ENV))
    named = bool(os.environ.get(db.EMBEDDED_DIR_ENV))
    per_user = not named and not project_dir.inside_a_project()
    directory = user_demo_dir() if per_user else db.embedded_dir()
    if per_user:
        os.environ[db.EMBEDDED_DIR_ENV] = str(directory)
    if reset:
        _refuse_a_reset_of_what_is_not_the_demos(directory, url_set)
        reset_demo_data(directory)
    resolved = db.resolve_database(announce=False, may_start_embedded=True)
    if not resolved.embedded:
        said = f"the demo writes to {db.mask_url(resolved.url)} ({db.DATABASE_URL_ENV}) and keeps Dagster's runs and "
        said += f"its mail in {directory}"
    elif per_user or directory == _user_demo_dir_or_none():
        said = f"the demo keeps its data in {directory} (no project here: a directory of yours); the next run "
        said += "reuses it, 'outbox-pipelines demo --reset' starts afresh"
    elif named:
        said = f"the demo keeps its data in {directory} ({db.EMBEDDED_DIR_ENV})"
    else:
        said = f"the demo keeps its data in {directory}, this project's embedded PostgreSQL (shared with 'dev')"
    if reset:
        said += " (reset: its earlier data was removed)"
    data_env = f"{db.EMBEDDED_DIR_ENV}={shlex.quote(str(directory))}" if per_user else ""
    return DemoData(resolved.url, directory, said, data_env)


def _user_demo_dir_or_none() -> Path | None:
    try:
        return user_demo_dir()
    except ConfigError:
        return None


def _refuse_a_reset_of_what_is_not_the_demos(directory: Path, url_set: bool) -> None:
    if url_set:
        raise ConfigError(
            f"--reset starts the demo's own embedded PostgreSQL afresh, and {db.DATABASE_URL_ENV} names a database of "
            f"yours, which the demo does not empty: unset {db.DATABASE_URL_ENV} (the demo then runs on its own "
            "server), or clear the demo's tables yourself"
        )
    if directory != _user_demo_dir_or_none():
        raise ConfigError(
            f"--reset removes only the demo's own directory ({'/'.join(('$XDG_DATA_HOME', *USER_DEMO_DIR))}, used "
            f"outside any project), and the demo runs on {directory} here, which holds this project's data too: "
            f"to start that afresh, 'outbox-pipelines db stop' then remove {directory} yourself"
        )


def reset_demo_data(directory: Path) -> None:
    """Stop the embedded server under ``directory`` and remove ``directory``, with its data where it was kept
    apart (run as root: under RELOCATED_DATA_BASE, linked from ``directory/pgdata``, as its origin file says)."""
    pgdata = directory / "pgdata"
    kept = pgdata.resolve().parent if pgdata.is_symlink() else None
    db.stop_embedded(directory)
    pid = _running_postmaster(pgdata)
    if pid is not None:
        raise ConfigError(f"the demo's PostgreSQL (pid {pid}) did not stop, so its data was kept: stop it and rerun")
    if kept is not None and kept.parent == db.RELOCATED_DATA_BASE and _origin(kept) == directory.resolve():
        shutil.rmtree(kept)
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.exists():
        shutil.rmtree(directory)


def _running_postmaster(pgdata: Path) -> int | None:
    """The pid in ``pgdata/postmaster.pid`` if that process runs (a crash leaves the file with a dead pid)."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def _origin(kept: Path) -> Path | None:
    try:
        return Path((kept / "origin").read_text().strip()).resolve()
    except OSError:
        return None
