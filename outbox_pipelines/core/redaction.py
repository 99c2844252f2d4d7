"""Secrets never reach people: URLs shown without their credentials, answers without the credential sent.

``mask_url`` is the one rule that shows a URL, host list or conninfo (``redact_text`` applies it inside free text);
``reads_two_ways`` / ``unencoded_userinfo`` find a user-info a client would misread; ``url_origin`` names a
destination; ``Scrubber`` takes one destination's credentials out of any text built from its answers.
"""

import base64
import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

# A credential in an echoed header or a log line, whoever sent it: "Bearer <token>", "Basic <base64>",
# "Authorization: <anything>" (a header dump), "token=<value>" / "api_key: <value>" in a query or body.
_AUTH_SCHEME = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=:-]{8,})")
_AUTH_HEADER = re.compile(r"(?i)(?P<key>\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\"'\r\n,}]+)")
_KEY_PARAM = re.compile(
    r"(?i)(?P<key>\b(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|signature|sig)"
    r"[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\"'&\s,;}]{3,})"
)
# What stands where a credential was: the one mask of the package (a test holds that no other module writes it).
MASK = "***"
# Pieces shorter than this are not scrubbed on their own: they would mangle ordinary words.
_MIN_SECRET = 4


# Where a URL's authority (user-info, hosts) starts: after its scheme's "://" (Kafka's SASL_SSL:// too).
# A URL inside free text runs from its scheme to the next white space.
_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+._-]*://")
_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+._-]*://\S*")
# What follows the "@" that ends a user-info: a host list (names, IPv6 in brackets, ports; several, comma-separated,
# as libpq and Kafka take them) or nothing (libpq's Unix socket in the query), up to a path, query, fragment, quote
# or the end. A raw "@" of the password is followed by neither, or by more of the password and another "@".
_HOST = r"(?:\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9._%-]+)"
_HOSTS_AFTER_AT = re.compile(rf"@{_HOST}?(?::\d*)?(?:,{_HOST}(?::\d*)?)*(?=[/?#'\"),;>\]]|$)")
# A secret in a query string or a key=value conninfo (quoted or not): password=, sslpassword=, token=, api_key= ...
_SECRET_PARAM = re.compile(
    r"(?i)(?P<key>(?<![A-Za-z0-9_])(?:(?:ssl)?password|passwd|secret|(?:access_|auth_)?token|api[_-]?key)\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&#'\"]*)"
)
# libpq's key=value conninfo ("host=h user=u password=p"): no user-info, its secrets are parameters.
_CONNINFO = re.compile(r"^\s*[A-Za-z_]+\s*=")
_RAW_IN_USERINFO = re.compile(r"[@/?#]")


def _userinfo(value: str) -> tuple[int, int, int] | None:
    """(where the user-info starts, where its first ":" is or -1, the "@" ending it) as the mask reads
    ``value``: a URL (also one a parser cannot read), or a host list without a scheme (Kafka's).

    The user-info ends at the last "@" a host list follows (or, without any, at the last "@"): a raw "@", "/",
    "?" or "#" of a password (which should have been percent-encoded) stays inside it, where a URL parser
    would end the password there and read the rest as a host, a path, a query or a fragment. A raw "@" after
    the host (``?application_name=a@b``) is read so too: over-masked, and refused where a URL is loaded."""
    scheme = _SCHEME.match(value)
    start = scheme.end() if scheme else 0
    if not scheme and _CONNINFO.match(value):
        return None
    ats = [match.start() for match in _HOSTS_AFTER_AT.finditer(value, start)]
    at = ats[-1] if ats else value.rfind("@", start)
    if at < 0:
        return None
    return start, value.find(":", start, at), at


def _keeps_user(value: str, start: int, colon: int, at: int) -> bool:
    """A PostgreSQL URL's role name is shown (libpq's user-info holds no token); any other scheme's user-info
    (a NATS or HTTP token is a bare user-info) and a host list's are masked whole."""
    scheme = value[: max(start - 3, 0)].lower()
    user = value[start : colon if colon >= 0 else at]
    return scheme.startswith("postgres") and not _RAW_IN_USERINFO.search(user)


def mask_url(value: str) -> str:
    """``value`` (a URL, parsable or not; a host list; a libpq key=value conninfo) with every credential
    shown as ``***``: the password of its user-info, or the whole user-info but a PostgreSQL role name
    (``postgresql://user:***@h1:5432,h2:5432/db``, ``amqp://***@[::1]:5672/``, ``***@broker:9092``), and
    the value of ``password=``, ``sslpassword=``, ``token=``, ``api_key=`` ... parameters.

    The one way this package shows a URL or host list that may hold a credential: database URLs, broker
    and destination URLs, Kafka's bootstrap servers, and (``redact_text``) any URL quoted in an error."""
    span = _userinfo(value)
    if span is not None:
        start, colon, at = span
        if _keeps_user(value, start, colon, at):
            if colon >= 0 and colon + 1 < at:
                value = value[: colon + 1] + MASK + value[at:]
        elif start < at:
            value = value[:start] + MASK + value[at:]
    return _SECRET_PARAM.sub(lambda m: m.group("key") + (MASK if m.group("value") else ""), value)


def secrets_in(value: str) -> set[str]:
    """The credentials ``value`` carries as ``mask_url`` reads it (its password, or its bare user-info, and
    its secret parameters), as written and percent-decoded: what a scrubber takes out of a driver's text."""
    found: set[str] = set()
    span = _userinfo(value)
    if span is not None:
        start, colon, at = span
        if not _keeps_user(value, start, colon, at):
            found.add(value[start:at])
        elif colon >= 0:
            found.add(value[colon + 1 : at])
    found.update(match.group("value").strip("'") for match in _SECRET_PARAM.finditer(value))
    return {s for v in found for s in (v, unquote(v)) if s}


def with_pieces(secrets: set[str], shortest: int = 3) -> set[str]:
    """``secrets`` and every piece of them between URL delimiters, of ``shortest`` characters or more: libpq's
    reading of a password with a raw "?", "/" or "#" splits it (a host "u", a port "Sec", a query "retPw@..."),
    and its error text then quotes a piece."""
    pieces = {piece for value in secrets for piece in re.split(r"[/?#@:&=]", value)}
    return {s for s in secrets | pieces if len(s) >= shortest}


def reads_two_ways(url: str) -> bool:
    """Whether a client would read ``url``'s user-info otherwise than ``mask_url`` shows it: a raw "@", "#", "?"
    or "/" in the password (``user:Zq@7x/Kp9@host``: libpq and httpx read the host ``7x``, and send the rest
    of the password elsewhere), or a raw "@" after the host where the URL has no user-info. Only a URL with a
    scheme is read so; a host list or a conninfo is not."""
    scheme = _SCHEME.match(url)
    if not scheme:
        return False
    start = scheme.end()
    ends = [i for i in (url.find(c, start) for c in "/?#") if i >= 0]
    authority = url[start : min(ends, default=len(url))]
    if authority.count("@") > 1:
        return True
    span = _userinfo(url)
    parsed_at = start + authority.find("@") if "@" in authority else -1
    return (span[2] if span is not None else -1) != parsed_at


def unencoded_userinfo(url: str, where: str) -> str | None:
    """The sentence refusing ``url`` when it ``reads_two_ways`` (``where`` names the setting or variable that
    holds it), else None. The URL is shown masked, its whole password hidden."""
    if not reads_two_ways(url):
        return None
    return (
        f"{where} = {mask_url(url)} reads two ways: its user-info holds a raw '@', '#', '?' or '/', so a client "
        "would take part of the password for the host, port, path or query: percent-encode the password "
        "(@ as %40, # as %23, ? as %3F, / as %2F; a raw '@' after the host as %40 too)"
    )


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of a URL: how a destination or webhook is shown (its path and query may
    carry a secret, its user-info does); ``<unparsable URL>`` when it has no host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname
    if not parts.scheme or not host:
        return "<unparsable URL>"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def redact_text(text: str) -> str:
    """Every URL inside free text (error messages, names) shown as ``mask_url`` shows it, and a conninfo's
    ``password=`` (or another secret parameter) masked wherever it is."""
    text = _URL_IN_TEXT.sub(lambda match: mask_url(match.group(0)), text)
    return _SECRET_PARAM.sub(lambda m: m.group("key") + (MASK if m.group("value") else ""), text)


def mask_credentials(text: str) -> str:
    """User-info, bearer and basic credentials, Authorization headers and key-like parameters masked, in
    any text: for what a third party wrote (an answer's body), whose secrets we cannot list."""
    text = redact_text(text)
    text = _AUTH_HEADER.sub(lambda m: m.group("key") + MASK, text)
    text = _AUTH_SCHEME.sub(_mask_scheme_value, text)
    return _KEY_PARAM.sub(lambda m: m.group("key") + MASK, text)


def _mask_scheme_value(match: re.Match[str]) -> str:
    """'Bearer <token>' / 'Basic <base64>' masked; 'basic validation' (a plain lower-case word) kept."""
    value = match.group("value")
    if value.isalpha() and value.islower():
        return match.group(0)
    return match.group("scheme") + match.group("sep") + MASK


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user-info, (user, password) or None), for clients that log URLs."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), (unquote(user), unquote(password))


class Scrubber:
    """Takes one destination's credentials out of text: its token, its Basic user and password (raw,
    encoded, base64), its webhook signing secret(s), its URL's path and query; and masks any credential-looking
    value besides.

    Applied to every text built from the destination's answer (error snippets, exception messages,
    references) before it is stored, logged or shown, so a destination that echoes request headers or
    its own URL cannot plant the credential in ``last_error``, the audit, the ledger, alerts or metadata.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        credentials: tuple[str, str] | None = None,
        signing_secret: str | None = None,
    ) -> None:
        secrets: set[str] = set()
        if token:
            secrets.add(token)
        for key in (signing_secret or "").split():  # each of a rotation's secrets, and its base64 without the prefix
            secrets.update((key, key.partition("_")[2]))
        if credentials is not None:
            user, password = credentials
            secrets.update((password, f"{user}:{password}"))
            secrets.add(base64.b64encode(f"{user}:{password}".encode()).decode())
        self._origin = url_origin(url)
        parts = urlsplit(url)
        self._urls = sorted({url, url.rstrip("/")}, key=len, reverse=True)
        for piece in (
            parts.path + (f"?{parts.query}" if parts.query else ""),
            parts.query,
            *parts.path.split("/"),
            *re.split(r"[&=]", parts.query),
        ):
            if len(piece) >= 8 or (piece.count("/") > 1 and len(piece) > 1):
                secrets.add(piece)  # a webhook's secret path, an ?apikey=...: long pieces, not "/orders"
        self._secrets = _longest_first(s for v in secrets for s in (v, unquote(v)) if len(s) >= _MIN_SECRET)

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        for url in self._urls:
            text = text.replace(url, self._origin)
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return mask_credentials(text)


class OriginOnlyLogs(logging.Filter):
    """Shows only the origin of the URLs an HTTP client logs ("HTTP Request: POST https://hooks.example.com/..."
    becomes "... https://hooks.example.com/…"): a webhook's path or query may be its secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(_origin_of_url(arg) for arg in record.args)
        return True


def _origin_of_url(value: object) -> object:
    text = str(value) if type(value).__name__ == "URL" or isinstance(value, str) else None
    if text is None or not text.startswith(("http://", "https://")):
        return value
    return url_origin(text) + "/…"


def hide_url_paths_in_http_client_logs() -> None:
    """Install OriginOnlyLogs on httpx's logger (once): its INFO line names every request's full URL."""
    logger = logging.getLogger("httpx")
    if not any(isinstance(f, OriginOnlyLogs) for f in logger.filters):
        logger.addFilter(OriginOnlyLogs())


def _longest_first(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(values), key=len, reverse=True))


# The words of libpq's and the server's own connection messages. The check for an unquoted piece of the password
# reads the message without them: "password authentication failed" holds "assw", "word" and "auth", which a
# password may hold too, and withholding that message would hide the most common login error.
_LIBPQ_WORDS = re.compile(
    r"\b(?:password|authentication|failed|connection|server|socket|database|does|not|exist|role|permitted|"
    r"login|entry|host|address|timeout|expired|refused|could|translate|name|received|invalid|response|supplied|"
    r"clients|already|system|starting|shutting|method|requested|running|accepting|connections|port|user|"
    r"fatal|error|SCRAM|SHA|SSL|TCP|IP|the|for|and|but|too|many|service|known|unknown|option|value|integer)\b",
    re.IGNORECASE,
)


def without_libpq_words(text: str) -> str:
    """``text`` with the words of libpq's and the server's own messages blanked: where to look for an unquoted
    piece of a password (core/storage/database_url.py, ``scrub``)."""
    return _LIBPQ_WORDS.sub(" ", text)
