"""Secrets never reach people: URLs shown without their credentials, answers without the credential sent.

- ``redact_url`` / ``redact_text``: user-info (``user:password@``) masked, in a URL or in free text.
- ``url_origin``: ``scheme://host[:port]`` only, how a destination or webhook URL is named in logs,
  run metadata and alerts (a Slack-style path or an ``?apikey=`` query is a secret too).
- ``Scrubber``: the credentials one destination was given (a bearer token, Basic user and password,
  the secret parts of its URL), taken out of any text built from what that destination answered.
"""

import base64
import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

# Up to the last "@" of the URL's run of text: a password may hold "/", "#" or "?" (generated ones often do),
# which a URL parser reads as the end of the user-info; masking a path's "@" too is the safe side.
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^@\s]*@")
# A credential in an echoed header or a log line, whoever sent it: "Bearer <token>", "Basic <base64>",
# "Authorization: <anything>" (a header dump), "token=<value>" / "api_key: <value>" in a query or body.
_AUTH_SCHEME = re.compile(r"(?i)\b(?P<scheme>bearer|basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=:-]{8,})")
_AUTH_HEADER = re.compile(r"(?i)(?P<key>\b(?:proxy-)?authorization\b[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\"'\r\n,}]+)")
_KEY_PARAM = re.compile(
    r"(?i)(?P<key>\b(?:api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|password|signature|sig)"
    r"[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\"'&\s,;}]{3,})"
)
# Pieces shorter than this are not scrubbed on their own: they would mangle ordinary words.
_MIN_SECRET = 4


def redact_url(url: str) -> str:
    """A URL without user-info (``user:password@``); anything unparsable is masked whole.

    Whatever comes before the URL's last "@" is masked, not only what a URL parser reads as user-info: a
    password holding "#", "?" or "/" ends the parser's user-info there, and a URL missing its "//" or its
    scheme has none; a mistyped URL is exactly what an error message shows."""
    if "@" in url:
        scheme, separator, rest = url.partition("://")
        after = url.rsplit("@", 1)[1]
        return f"{scheme}://***@{after}" if separator and "@" in rest else f"***@{after}"
    try:
        urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    return url


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
    """Any URL user-info inside free text (error messages, names) masked."""
    return _USERINFO.sub(lambda match: f"{match.group('scheme')}***@", text)


def mask_credentials(text: str) -> str:
    """User-info, bearer and basic credentials, Authorization headers and key-like parameters masked, in
    any text: for what a third party wrote (an answer's body), whose secrets we cannot list."""
    text = redact_text(text)
    text = _AUTH_HEADER.sub(lambda m: m.group("key") + "***", text)
    text = _AUTH_SCHEME.sub(_mask_scheme_value, text)
    return _KEY_PARAM.sub(lambda m: m.group("key") + "***", text)


def _mask_scheme_value(match: re.Match[str]) -> str:
    """'Bearer <token>' / 'Basic <base64>' masked; 'basic validation' (a plain lower-case word) kept."""
    value = match.group("value")
    if value.isalpha() and value.islower():
        return match.group(0)
    return match.group("scheme") + match.group("sep") + "***"


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
    encoded, base64), its URL's path and query; and masks any credential-looking value besides.

    Applied to every text built from the destination's answer (error snippets, exception messages,
    references) before it is stored, logged or shown, so a destination that echoes request headers or
    its own URL cannot plant the credential in ``last_error``, the audit, the ledger, alerts or metadata.
    """

    def __init__(self, url: str, *, token: str | None = None, credentials: tuple[str, str] | None = None) -> None:
        secrets: set[str] = set()
        if token:
            secrets.add(token)
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
            text = text.replace(secret, "***")
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
