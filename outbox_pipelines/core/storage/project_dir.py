"""The project's root and its private ``.outbox/`` (mode 0700), where the embedded server's data lives.

The root is the nearest directory holding ``pyproject.toml``, ``outbox.toml`` or ``.outbox``. An embedded server
starts only where it was asked for; elsewhere a missing OUTBOX_DATABASE_URL is an error naming it.
Why: docs/explanation/storage.md, "The embedded server's home".
"""

import os
import stat
import tomllib
from pathlib import Path

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.storage.database_url import DATABASE_URL_ENV

EMBEDDED_DIR_ENV = "OUTBOX_EMBEDDED_DIR"
PROJECT_ENV = "OUTBOX_PROJECT"
PRIVATE_DIR_MODE, PRIVATE_FILE_MODE = 0o700, 0o600

# What marks a project's root: the embedded server's data lives next to it, whichever
# sub-directory a command runs in.
PROJECT_MARKERS = ("pyproject.toml", "outbox.toml", ".outbox")


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` (default: the working directory) holding a project marker.

    ``start`` itself when none does, so a directory outside any project keeps its own ``.outbox/``.
    """
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if any((directory / marker).exists() for marker in PROJECT_MARKERS):
            return directory
    return here


def project_name(start: Path | None = None) -> str:
    """The name a project's outbox tables are owned under (core/storage/table_owners.py): OUTBOX_PROJECT, else
    its pyproject.toml's ``[project] name``, else its Dagster ``root_module``, else its root directory's name."""
    explicit = os.environ.get(PROJECT_ENV, "").strip()
    if explicit:
        return explicit[:200]
    root = project_root(start)
    try:
        pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        pyproject = {}
    name = pyproject.get("project", {}).get("name") or pyproject.get("tool", {}).get("dg", {}).get("project", {}).get(
        "root_module"
    )
    return str(name)[:200] if isinstance(name, str) and name.strip() else root.name or "/"


def inside_a_project(start: Path | None = None) -> bool:
    """Whether ``start`` (default: the working directory) or a directory above it holds a project marker."""
    here = (start or Path.cwd()).resolve()
    return any((directory / marker).exists() for directory in (here, *here.parents) for marker in PROJECT_MARKERS)


def user_data_dir(*parts: str) -> Path:
    """A directory of this user's data: ``$XDG_DATA_HOME/<parts>``, else ``~/.local/share/<parts>`` (the XDG
    base directory default; a relative XDG_DATA_HOME is ignored, as the specification says). Not created."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        try:
            base = str(Path.home() / ".local" / "share")
        except RuntimeError:  # no HOME and no password entry: nowhere that is this user's
            raise ConfigError(
                f"cannot tell where this user's data goes (HOME and XDG_DATA_HOME are unset): set "
                f"{EMBEDDED_DIR_ENV} to the directory for the embedded server's data, or {DATABASE_URL_ENV}"
            ) from None
    return Path(base, *parts).resolve()


def embedded_asked_for(root: Path | None = None) -> bool:
    """Whether the project's outbox.toml says ``embedded = true``: with OUTBOX_DATABASE_URL unset, its commands
    use (and start) the embedded server under its ``.outbox/`` (core/settings/declarations.py checks the key)."""
    try:
        return tomllib.loads(((root or project_root()) / "outbox.toml").read_text()).get("embedded") is True
    except (OSError, tomllib.TOMLDecodeError):
        return False


def refuse_an_unasked_server(root: Path) -> None:
    """ConfigError naming OUTBOX_DATABASE_URL unless an embedded server at ``root`` was asked for: ``.outbox/``
    exists there (``dev`` or ``demo`` made it, or the user did), OUTBOX_EMBEDDED_DIR is set, or the project's
    outbox.toml says ``embedded = true``."""
    if os.environ.get(EMBEDDED_DIR_ENV) or root.exists() or embedded_asked_for():
        return
    import difflib  # a mistake's path only: not imported by every start

    near = difflib.get_close_matches(DATABASE_URL_ENV, [k for k in os.environ if k != DATABASE_URL_ENV], n=1)
    typo = f" ({near[0]} is set: a typo?)" if near else ""
    raise ConfigError(
        f"{DATABASE_URL_ENV} is unset{typo}: set it to your database, e.g. "
        f"{DATABASE_URL_ENV}=postgresql://USER@HOST:5432/DBNAME. No embedded PostgreSQL is started without being "
        f"asked: for one on this machine run 'outbox-pipelines dev' (it keeps one under {root}), mkdir {root}, "
        f"set {EMBEDDED_DIR_ENV}, or write embedded = true in the project's outbox.toml"
    )


def refuse_a_server_outside_any_project(root: Path) -> None:
    """A command run outside any project (no marker at or above the working directory, OUTBOX_EMBEDDED_DIR and
    OUTBOX_DATABASE_URL unset) would leave a PostgreSQL server and its data in a directory nobody chose:
    ConfigError saying how to choose one instead."""
    if os.environ.get(EMBEDDED_DIR_ENV) or root.exists():
        return
    here = Path.cwd().resolve()
    if any((directory / marker).exists() for directory in (here, *here.parents) for marker in PROJECT_MARKERS):
        return
    raise ConfigError(
        f"no project here: {here} and the directories above it hold no {', '.join(PROJECT_MARKERS)}, and "
        f"{DATABASE_URL_ENV} is unset, so no server was started. Run the command in your project's directory, "
        f"set {DATABASE_URL_ENV}, or keep an embedded server here on purpose: mkdir .outbox (or set "
        f"{EMBEDDED_DIR_ENV} to the directory for its data)"
    )


def embedded_dir() -> Path:
    """Where the embedded server's files are: OUTBOX_EMBEDDED_DIR, else ``.outbox/`` at the project root."""
    return Path(os.environ.get(EMBEDDED_DIR_ENV) or project_root() / ".outbox").resolve()


def make_private_dirs(path: Path) -> Path:
    """``path`` as a directory; it and every missing parent are created 0700 (whatever the umask)."""
    missing: list[Path] = []
    here = path
    while not here.exists():
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
    return path


def private_embedded_dir(data_root: Path | None = None) -> Path:
    """``data_root`` (default: the project's ``.outbox/`` or OUTBOX_EMBEDDED_DIR), created if missing and
    made private: mode 0700 (also one an earlier version made 0755), unless someone else owns it."""
    root = (data_root or embedded_dir()).resolve()
    root.parent.mkdir(parents=True, exist_ok=True)  # a named directory's parents as `mkdir -p` makes them
    make_private_dirs(root)
    st = os.stat(root)
    if stat.S_IMODE(st.st_mode) & 0o077 and os.geteuid() in (0, st.st_uid):
        os.chmod(root, stat.S_IMODE(st.st_mode) & 0o700)
    return root


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a file only its owner can read (0600), over an existing one too."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), PRIVATE_FILE_MODE)  # an existing file keeps its mode otherwise
        out.write(data)
