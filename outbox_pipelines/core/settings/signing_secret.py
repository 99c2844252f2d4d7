"""A webhook signing secret as Standard Webhooks writes it (``whsec_<base64>``, several separated by spaces for
a rotation), and the v1 signature it makes: one rule for the signer (destinations/signing.py) and the receiver's
verifier (inbox/webhook_verification.py)."""

import base64
import binascii
import hashlib
import hmac

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


def v1_signature(key: bytes, sent_id: bytes, timestamp: bytes, body: bytes) -> bytes:
    """The v1 signature: HMAC-SHA256 of ``id.timestamp.body``, the id and timestamp exactly as their headers
    carry them."""
    return hmac.new(key, sent_id + b"." + timestamp + b"." + body, hashlib.sha256).digest()
