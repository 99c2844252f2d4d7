"""Who may call the Order API, and how a caller's idempotency keys are kept apart from another's.

Bearer tokens (``OUTBOX_API_TOKEN``) are only compared here, never sent, stored or logged; a caller's ledger
scope is ``h:`` + HMAC-SHA256(server secret, token). Why, and the legacy ``t:`` scope:
docs/explanation/orders.md, "Callers and their keys".
"""

import hashlib
import hmac
import logging
import secrets
import threading
import time

import psycopg

from outbox_pipelines.core.errors import ConfigError
from outbox_pipelines.core.listen import is_loopback  # shared with `outbox-pipelines dev`

log = logging.getLogger("outbox_pipelines.orders.api")

SCOPE_PREFIX = "h:"
LEGACY_PREFIX = "t:"
MIN_SECRET_CHARS = 16
LEGACY_RECHECK_S = 60.0  # how often "are there legacy ledger rows left?" is asked again


def legacy_scope(token: str) -> str:
    """The scope of keys accepted before the HMAC scheme (an unsalted hash of the token)."""
    return LEGACY_PREFIX + hashlib.sha256(token.encode()).hexdigest()[:16]


def hmac_scope(secret: str, token: str) -> str:
    digest = hmac.new(secret.encode(), b"outbox-order-api-scope\x00" + token.encode(), hashlib.sha256).hexdigest()
    return SCOPE_PREFIX + digest[:32]


def validate_secret(secret: str | None) -> str | None:
    if secret is None or secret == "":
        return None
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(
            f"OUTBOX_API_SCOPE_SECRET must be at least {MIN_SECRET_CHARS} characters "
            "(e.g. the output of: python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return secret


class Tokens:
    """The accepted tokens, compared in constant time, and the ledger scope of each."""

    def __init__(self, tokens: tuple[str, ...], secret: str | None) -> None:
        self.tokens = tokens
        self._scopes: tuple[str, ...] | None = None
        self._lock = threading.Lock()
        if secret is not None:
            self.install(secret)
        self._legacy_possible = True
        self._legacy_checked = -LEGACY_RECHECK_S

    def __bool__(self) -> bool:
        return bool(self.tokens)

    def match(self, authorization: str) -> int | None:
        """The index of the token in ``Authorization: Bearer <token>``, or None."""
        presented = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
        matched = None
        for index, token in enumerate(self.tokens):  # compare with every token: no early exit to time
            if hmac.compare_digest(presented.encode(), token.encode()) and presented:
                matched = index
        return matched

    # -- scopes ----------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The scopes are known (a secret from the environment, or read from the database once)."""
        return self._scopes is not None or not self.tokens

    def install(self, secret: str) -> None:
        with self._lock:
            if self._scopes is None:
                self._scopes = tuple(hmac_scope(secret, token) for token in self.tokens)

    def scope(self, index: int | None) -> str:
        if index is None:
            return ""
        assert self._scopes is not None, "Tokens.install first"
        return self._scopes[index]

    def effective_scope(self, conn: psycopg.Connection, index: int | None, key: str) -> str:
        """The caller's scope for ``key``: the legacy one when the ledger still holds the key under it."""
        scope = self.scope(index)
        if index is None or not self._legacy_rows_may_exist(conn):
            return scope
        legacy = legacy_scope(self.tokens[index])
        found = conn.execute(
            "SELECT 1 FROM idempo_ledger WHERE scope = %s AND idempotency_key = %s", (legacy, key)
        ).fetchone()
        return legacy if found else scope

    def _legacy_rows_may_exist(self, conn: psycopg.Connection) -> bool:
        # Once none are left, none come back (this code never writes a legacy scope), but an
        # instance of the old version may still be running during a rolling upgrade: ask again
        # now and then, it is one index probe.
        now = time.monotonic()
        if now - self._legacy_checked < LEGACY_RECHECK_S:
            return self._legacy_possible
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM idempo_ledger WHERE scope >= %s AND scope < %s)",
            (LEGACY_PREFIX, LEGACY_PREFIX[:-1] + chr(ord(LEGACY_PREFIX[-1]) + 1)),
        ).fetchone()
        assert row is not None
        self._legacy_possible = bool(row[0])
        self._legacy_checked = now
        return self._legacy_possible


def read_or_create_secret(conn: psycopg.Connection) -> str:
    """The database's scope secret, created by the first API that asks (every instance agrees).

    Run it in a transaction of its own and keep the secret only once that committed."""
    conn.execute(
        "INSERT INTO outbox_api_secret (secret) VALUES (%s) ON CONFLICT (id) DO NOTHING", (secrets.token_hex(32),)
    )
    row = conn.execute("SELECT secret FROM outbox_api_secret WHERE id").fetchone()
    assert row is not None
    return str(row[0])


# -- where the API listens -----------------------------------------------------------------------------
def check_exposure(host: str, has_tokens: bool, allow_anonymous: bool) -> str | None:
    """Refuse (ConfigError, exit 2) to serve without tokens on an address others can reach, unless
    ``allow_anonymous``; return the warning to log when the API is open, else None."""
    if has_tokens:
        return None
    if not is_loopback(host) and not allow_anonymous:
        raise ConfigError(
            f"refusing to serve the Order API on {host} without a token: anyone who can reach it could "
            "place orders. Set OUTBOX_API_TOKEN (comma-separated bearer tokens), bind to 127.0.0.1, "
            "or pass --allow-anonymous to serve it open on purpose"
        )
    where = "on loopback only" if is_loopback(host) else f"on {host} (--allow-anonymous)"
    return (
        f"the Order API is open {where}: no OUTBOX_API_TOKEN, so any caller can place orders "
        "and read /metrics; set OUTBOX_API_TOKEN to require a bearer token"
    )
