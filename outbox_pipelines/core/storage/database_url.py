"""A database URL: read as libpq reads it, converted for SQLAlchemy, and refused when it reads two ways.

Its password never appears in a message: errors show it as ``redaction.mask_url`` does, a user-info holding a raw
``@``, ``#``, ``?`` or ``/`` is refused (``parse_url``, ``refuse_two_way_url``), and a libpq message is shown only
without what it quotes of the password (``scrub``).
"""

import os
import re
from typing import Any
from urllib.parse import quote, urlencode

import psycopg

from outbox_pipelines.core.errors import InvalidDatabaseUrl
from outbox_pipelines.core.redaction import (
    MASK,
    mask_url,
    secrets_in,
    unencoded_userinfo,
    with_pieces,
    without_libpq_words,
)

DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"


def psycopg_url(url: str) -> str:
    """A libpq URL: drop SQLAlchemy's driver suffix if present."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


# The variables a database URL is read from, named when one of them holds the URL refused.
_URL_VARIABLES = (DATABASE_URL_ENV, "OUTBOX_DIRECT_DATABASE_URL", "OUTBOX_DAGSTER_PG_URL")
# What libpq puts between double quotes in a message: the values it read (a host, a user, a port, a piece of the
# URL it could not parse), the only place a piece of the URL's password can be.
_QUOTED = re.compile(r'"[^"]*"')


def _variable(url: str) -> str | None:
    """The variable that holds ``url`` (None: the code passed it, ``outbox_resources(url=...)``, ``connect``)."""
    for name in _URL_VARIABLES:
        if os.environ.get(name) and os.environ[name].strip() in (url, psycopg_url(url)):
            return name
    return None


def refuse_two_way_url(url: str) -> None:
    """InvalidDatabaseUrl, "percent-encode the password", when the URL's user-info holds a raw '@', '#', '?' or
    '/': libpq would read a host, a port or a database out of the password and send that piece to DNS."""
    problem = unencoded_userinfo(url, _variable(url) or "the database URL passed in code")
    if problem is not None:
        raise InvalidDatabaseUrl(problem)


def _secrets_of(url: str) -> set[str]:
    """The password(s) a URL carries, raw and decoded, to scrub them from any message."""
    found = secrets_in(url)
    try:
        password = psycopg.conninfo.conninfo_to_dict(psycopg_url(url)).get("password")
    except psycopg.Error:
        password = None
    if password:
        found.add(str(password))
    return with_pieces(found)


def _holds_a_piece(text: str, secrets: set[str], shortest: int = 3) -> bool:
    """Whether ``text`` holds ``shortest`` or more characters in a row of any secret."""
    return any(secret[i : i + shortest] in text for secret in secrets for i in range(len(secret) - shortest + 1))


def _quoted(quoted: str, secrets: set[str]) -> str:
    """What libpq quoted, as shown: the URL it quotes (masked already) named, not repeated; a piece of the
    password as ``***``."""
    if _holds_a_piece(quoted, secrets):
        return f'"{MASK}"'
    return "the URL" if "://" in quoted else quoted


def scrub(text: str, url: str) -> str:
    """``text`` (a libpq message) without the URL or any piece of its password: a quoted value holding the URL
    or 3 characters in a row of the password is shown as ``***``; a message that still holds such a piece
    outside quotes is not quoted at all."""
    for raw in {url, psycopg_url(url)}:
        text = text.replace(raw, mask_url(raw))
    secrets = _secrets_of(url)
    text = _QUOTED.sub(lambda m: _quoted(m.group(0), secrets), text)
    if _holds_a_piece(without_libpq_words(text), {s for s in secrets if len(s) >= 4}, shortest=4):
        return "libpq's own message is not shown: it quotes part of the URL's password"
    return text


def _bad_url(url: str, reason: str) -> InvalidDatabaseUrl:
    return InvalidDatabaseUrl(
        f"the database URL {mask_url(url)} ({_variable(url) or 'passed in code'}) is not valid: {scrub(reason, url)}. "
        "Write it as postgresql://user:password@host:5432/dbname (percent-encode special characters, "
        "e.g. @ as %40 in a password), or unset OUTBOX_DATABASE_URL to use the embedded server under .outbox/."
    )


def parse_url(url: str) -> dict[str, Any]:
    """libpq's reading of ``url`` (key=value conninfo too), or InvalidDatabaseUrl with the password masked."""
    refuse_two_way_url(url)
    reason = ""
    try:
        info = psycopg.conninfo.conninfo_to_dict(psycopg_url(url))
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip()
    else:
        # libpq reads the port only when it connects; a bad one is the URL's fault too.
        ports = str(info.get("port") or "")
        if not ports or all(not p or (p.isdigit() and 0 < int(p) < 65536) for p in ports.split(",")):
            return info
        reason = f"the port {ports!r} is not a number from 1 to 65535"
    # Raised here, outside the except block: no chained exception carries libpq's raw
    # message (which quotes the whole URL) into a traceback or Dagster's error data.
    raise _bad_url(url, reason or "libpq cannot parse it")


def url_with_database(url: str, database: str) -> str:
    """The same server and credentials, another database, as a URL (works for Unix sockets too)."""
    params = {k: v for k, v in parse_url(url).items() if v is not None}
    params.pop("dbname", None)
    return f"postgresql:///{quote(database)}" + (f"?{urlencode(params)}" if params else "")


def sqlalchemy_url(url: str) -> str:
    """The same server as a SQLAlchemy URL on psycopg 3 (accepts key=value conninfo too)."""
    url = psycopg_url(url)
    info = parse_url(url)  # a malformed URL fails here, masked, not inside SQLAlchemy with the password shown
    if not url.startswith(("postgresql://", "postgres://")):
        url = url_with_database(url, str(info.get("dbname") or "postgres"))
    return "postgresql+psycopg://" + url[len("postgresql://") :]
