"""Who is calling the Order API, and whether they may: token, failed attempts, rate, address.

An address with too many failed authentications gets 429 before its token is even looked at; a
wrong or missing bearer token is 401 (and one more failure); each client (its token, else its
address) has its requests per minute (429). The client's address is the peer's, or X-Forwarded-For
from a trusted proxy only (OUTBOX_TRUSTED_PROXIES).
"""

import ipaddress

from starlette.requests import Request

from outbox_pipelines.orders.api.auth import Tokens
from outbox_pipelines.orders.api.config import ApiSettings
from outbox_pipelines.orders.api.ratelimit import FailureLimiter, RateLimiter
from outbox_pipelines.orders.api.responses import Rejection


class Callers:
    def __init__(self, settings: ApiSettings, tokens: Tokens) -> None:
        self.settings = settings
        self.tokens = tokens
        self.limiter = RateLimiter(settings.rate_per_minute)
        self.auth_failures = FailureLimiter(settings.auth_failures_per_minute)
        self._proxies = [ipaddress.ip_network(p, strict=False) for p in settings.trusted_proxies]

    def admit(self, request: Request) -> int | None:
        """The caller authenticated, then within its rate; the index of its token (None: the API is open)."""
        caller = self.authenticate(request)
        self.rate_limit(self.client_id(request, caller))
        return caller

    def authenticate(self, request: Request) -> int | None:
        """None when the API is open; else the index of the caller's token.

        An address with too many failed attempts gets 429 before its token is even
        looked at (right or wrong); a wrong or missing token is 401 and one more failure."""
        if not self.tokens:
            return None
        address = self.client_address(request)
        wait = self.auth_failures.blocked(address)
        if wait:
            raise Rejection(
                429,
                "RATE_LIMITED",
                f"too many failed authentications from this address (over "
                f"{self.settings.auth_failures_per_minute} per minute); retry after Retry-After seconds",
                headers={"Retry-After": str(wait)},
                reason="auth_failures",
                retry_after=wait,
            )
        index = self.tokens.match(request.headers.get("authorization", ""))
        if index is None:
            self.auth_failures.failed(address)
            raise Rejection(
                401, "UNAUTHORIZED", "send Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"}
            )
        return index

    def client_address(self, request: Request) -> str:
        """The peer address; X-Forwarded-For is believed only from a trusted proxy (OUTBOX_TRUSTED_PROXIES),
        so a client cannot dodge a limit by inventing addresses."""
        peer = request.client.host if request.client else "unknown"
        forwarded = request.headers.get("x-forwarded-for")
        if forwarded and self._proxies:
            try:
                peer_ip = ipaddress.ip_address(peer)
                if any(peer_ip in net for net in self._proxies):
                    return forwarded.split(",")[-1].strip() or peer
            except ValueError:
                pass
        return peer

    def client_id(self, request: Request, token_index: int | None) -> str:
        """The rate-limit identity: the caller's token, else its address."""
        return f"token#{token_index}" if token_index is not None else self.client_address(request)

    def rate_limit(self, client: str) -> None:
        wait = self.limiter.allow(client)
        if wait:
            raise Rejection(
                429,
                "RATE_LIMITED",
                f"over {self.settings.rate_per_minute} requests per minute",
                headers={"Retry-After": str(wait)},
                retry_after=wait,
            )
