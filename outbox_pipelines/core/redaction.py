"""Secrets never reach people: URLs shown without their credentials."""

import re
from urllib.parse import unquote, urlsplit, urlunsplit

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]*@")


def redact_url(url: str) -> str:
    """An HTTP(S) URL without user-info (``user:password@``); anything unparsable is masked whole."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"***@{host}", parts.path, parts.query, parts.fragment))


def redact_text(text: str) -> str:
    """Any URL user-info inside free text (error messages, names) masked."""
    return _USERINFO.sub(lambda match: f"{match.group('scheme')}***@", text)


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(the URL without user-info, (user, password) or None), for clients that log URLs."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), (unquote(user), unquote(password))
