"""A database URL: read as libpq reads it, converted for SQLAlchemy, and shown with its password masked.

A database URL's password never appears in a message: every error shows the
URL with the password masked (``mask_password``), and a libpq error that quotes
it is scrubbed (``scrub``).
"""

import re
from typing import Any
from urllib.parse import quote, unquote, urlencode

import psycopg

from outbox_pipelines.core.errors import InvalidDatabaseUrl

DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"


def psycopg_url(url: str) -> str:
    """A libpq URL: drop SQLAlchemy's driver suffix if present."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    return url


# password=... in key=value conninfo or in a URL's query (sslpassword too).
_PASSWORD_PARAM = re.compile(r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&]*)", re.IGNORECASE)


# What follows the ``@`` of user-info: a host list as libpq takes it (names, IPv6 in brackets, ports), or nothing
# (a Unix socket in the query), up to the path, the query or the end.
_HOSTS_AFTER_AT = re.compile(
    r"@(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._%-]+)?(?::\d*)?"
    r"(?:,(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._%-]+)(?::\d*)?)*(?=[/?#]|$)"
)


def _userinfo_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host`` is, also in a URL libpq cannot parse.

    The password ends at the last ``@`` that a host list follows: a raw ``@``, ``/``, ``?`` or ``#`` in it
    (which should have been percent-encoded) is masked with the rest of the password, never shown in part.
    Without such an ``@`` before the query, one inside it counts too: ``user:pa?ss@host`` reads as a query.
    """
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    query = url.find("?", start)
    ats = [match.start() for match in _HOSTS_AFTER_AT.finditer(url, start)]
    before_query = [at for at in ats if query < 0 or at < query]
    at = (before_query or ats or [-1])[-1]
    if at < 0:
        at = url.rfind("@", start, len(url) if query < 0 else query)
    if at < 0:
        return None
    colon = url.find(":", start, at)
    if colon < 0 or colon + 1 == at:  # no password, or an empty one
        return None
    return colon + 1, at


def mask_password(url: str) -> str:
    """The URL (or key=value conninfo) with any password shown as ``***``; parsable or not."""
    span = _userinfo_span(url)
    if span is not None:
        url = url[: span[0]] + "***" + url[span[1] :]
    return _PASSWORD_PARAM.sub(lambda m: m.group("key") + ("***" if m.group("value") else ""), url)


def redact(url: str) -> str:
    """The URL with any password hidden, for messages."""
    return mask_password(url)


def _secrets_of(url: str) -> set[str]:
    """The password(s) a URL carries, raw and decoded, to scrub them from any message."""
    found: set[str] = set()
    span = _userinfo_span(url)
    if span is not None:
        found.add(url[span[0] : span[1]])
    for match in _PASSWORD_PARAM.finditer(url):
        found.add(match.group("value").strip("'"))
    try:
        password = psycopg.conninfo.conninfo_to_dict(psycopg_url(url)).get("password")
    except psycopg.Error:
        password = None
    if password:
        found.add(str(password))
    # libpq's own reading of a password with a raw "?", "/" or "#" splits it (a host "u", a port "Sec", a query
    # "retPw@..."); its error text then quotes a piece: every piece of 3 characters or more is a secret too.
    pieces = {piece for value in found for piece in re.split(r"[/?#@:&=]", value)}
    return {s for v in found | pieces for s in (v, unquote(v)) if len(s) >= 3}


def scrub(text: str, url: str) -> str:
    """``text`` (say, a libpq error) with ``url`` shown masked and its password nowhere."""
    for raw in {url, psycopg_url(url)}:
        text = text.replace(raw, mask_password(raw))
    secrets = sorted(_secrets_of(url), key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, "***")
    # Only a password with a raw "?", "/", "#" or "@" is cut by libpq's parser and quoted in pieces; masking
    # fragments of any other would also hide ordinary words it happens to contain ("password").
    return _mask_fragments(text, [secret for secret in secrets if re.search(r"[?/#@]", secret)])


def _mask_fragments(text: str, secrets: list[str], shortest: int = 4) -> str:
    """Any run of ``shortest`` or more characters of ``text`` that is also part of a secret, masked: libpq
    quotes a password it cut at a raw '?', '/' or '#' from the middle ("re/t#Pw@host")."""
    out, i = [], 0
    while i < len(text):
        length = 0
        for secret in secrets:
            n = shortest
            while i + n <= len(text) and text[i : i + n] in secret:
                n += 1
            length = max(length, n - 1 if n - 1 >= shortest else 0)
        if length:
            out.append("***")
            i += length
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _bad_url(url: str, reason: str) -> InvalidDatabaseUrl:
    return InvalidDatabaseUrl(
        f"the database URL {mask_password(url)} is not valid: {scrub(reason, url)}. "
        "Write it as postgresql://user:password@host:5432/dbname (percent-encode special characters, "
        "e.g. @ as %40 in a password), or unset OUTBOX_DATABASE_URL to use the embedded server under .outbox/."
    )


def parse_url(url: str) -> dict[str, Any]:
    """libpq's reading of ``url`` (key=value conninfo too), or InvalidDatabaseUrl with the password masked."""
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
