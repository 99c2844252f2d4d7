"""Standard Webhooks signatures (https://www.standardwebhooks.com) for an HTTP table that names a secret.

Each delivery carries ``webhook-id`` (the message's event_id, the same on every attempt, so a receiver
drops a redelivery), ``webhook-timestamp`` (the attempt's Unix seconds) and ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``). The secret is ``whsec_<base64>`` as the spec and
its libraries write it; several secrets separated by spaces (a rotation) each sign, so a receiver that
knows either verifies. The secret comes from the environment (``signing_secret_env``), never the file.
"""

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable

PREFIX = "whsec_"


def signing_keys(secret: str) -> tuple[bytes, ...]:
    """The HMAC keys a secret names (one, or several for a rotation); ValueError saying what is wrong,
    without the secret."""
    keys = []
    for part in secret.split():
        encoded = part[len(PREFIX) :] if part.startswith(PREFIX) else part
        try:
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(
                "a webhook signing secret is whsec_ followed by base64 (as Standard Webhooks "
                "libraries generate it); this one is not base64"
            ) from None
        if len(key) < 16:
            raise ValueError(f"a webhook signing secret must hold at least 16 bytes of key; this one holds {len(key)}")
        keys.append(key)
    if not keys:
        raise ValueError("the webhook signing secret is empty")
    return tuple(keys)


class WebhookSigner:
    """Adds the three Standard Webhooks headers to a request, from its exact body bytes."""

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        self._keys = signing_keys(secret)
        self._clock = clock

    def headers(self, message_id: str, body: bytes) -> dict[str, str]:
        timestamp = str(int(self._clock()))
        signed = message_id.encode() + b"." + timestamp.encode() + b"." + body
        signatures = " ".join(
            "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode() for key in self._keys
        )
        return {"webhook-id": message_id, "webhook-timestamp": timestamp, "webhook-signature": signatures}
