"""Why an order failed, as the ledger (and GET /do/order/{key}) tells it: the Order API's error map.

The HTTP status returned with each code is stored in the ledger row (``http_status``,
and in the replayed ``response``): for most failures it is the broker's own status
(400, 404, 409, 422, 408, 429, 5xx), known only here, from what the last attempt saw.
"""

import re

from outbox_pipelines.core import models as m

BROKER_REJECTED = "BROKER_REJECTED"  # the broker refused the order (a 4xx): sending it again cannot help
BROKER_TIMEOUT = "BROKER_TIMEOUT"  # the broker did not answer in time, attempt after attempt (504)
BROKER_DOWN = "BROKER_DOWN"  # the broker could not be reached or failed (connection errors, 5xx) (503)
INTERNAL_ERROR = "INTERNAL_ERROR"  # the order failed on this side, not at the broker (500)

_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")


def failure_code(
    error_code: str | None, error: str | None = None, http_status: int | None = None, failure: str | None = None
) -> tuple[str, int]:
    """Seed 001's (error code, HTTP status) of a dead order, from what its last attempt saw.

    ``http_status`` is the broker's answer (None: no answer); ``failure`` says why there was
    none (HttpDestination's Attempt.failure: timeout, connection, protocol, refused). Without
    either (the attempt was made by another process), the outbox code and error text decide.
    """
    if http_status is None and failure is None and error:
        found = _HTTP_STATUS.search(error)
        http_status = int(found.group(1)) if found else None
    if http_status is not None and 400 <= http_status < 500 and http_status not in (408, 429):
        return BROKER_REJECTED, http_status  # 400, 401, 403, 404, 409, 422 ...: the broker said no
    no_answer = http_status is None and failure is None
    if failure == "refused" or (no_answer and error_code in (m.BAD_REQUEST, m.UNAUTHORIZED)):
        # Never sent: the request could not be built or the HTTP client refused it (seed 001: BROKER_REJECTED 400).
        return BROKER_REJECTED, 401 if error_code == m.UNAUTHORIZED else 400
    if (
        http_status in (408, 504)
        or failure == "timeout"
        or (no_answer and error_code == m.NETWORK_TIMEOUT and "no answer within" in (error or ""))
    ):
        return BROKER_TIMEOUT, http_status or 504
    if http_status is not None and 500 <= http_status < 600:
        return BROKER_DOWN, http_status
    if failure == "connection" or (
        failure is None and error_code in (*m.NETWORK_FAILURES, m.BROKER_5XX, m.RATE_LIMITED)
    ):
        return BROKER_DOWN, http_status if http_status == 429 else 503
    if failure in ("protocol", "error") or http_status is not None or error_code == m.UNKNOWN:
        return BROKER_DOWN, 502  # answers that could not be used (garbage, a broken connection mid-answer, 3xx)
    return INTERNAL_ERROR, 500


# What a caller is told of a failure: our words, the HTTP status and what the last attempt saw; never the
# broker's own text, which may quote anything (a proxy's page, echoed request headers). That text stays in the
# outbox row and its audit, for operators, with the destination's credentials scrubbed.
def caller_reason(code: str, outbox_code: str | None, http_status: int, failure: str | None, attempts: int) -> str:
    """The ledger's ``reason`` (GET /do/order/{key}, a replayed POST): '<code>: <outbox code>: <our words>'."""
    tries = f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}"
    if failure == "refused":
        words = "the order could not be turned into a broker request; nothing reached the broker"
    elif code == BROKER_REJECTED:
        words = f"HTTP {http_status}, the broker refused the order"
    elif failure == "timeout" or code == BROKER_TIMEOUT:
        words = f"no answer from the broker in time (HTTP {http_status}); {tries}"
    elif failure == "connection":
        words = f"the broker could not be reached (connection failed); {tries}"
    elif code == BROKER_DOWN:
        words = f"HTTP {http_status}, the broker failed or answered what could not be used; {tries}"
    else:
        words = f"the order could not be sent (HTTP {http_status})"
    return f"{code}: {outbox_code or m.UNKNOWN}: {words}"
