"""Standard Webhooks signatures (https://www.standardwebhooks.com) for an HTTP table that names a secret.

Each delivery carries ``webhook-id`` (the event_id, ASCII as ``header_id`` writes it), ``webhook-timestamp`` and
``webhook-signature`` over the exact bytes sent; the secret comes from the environment, never the file.
Why the id is encoded so: docs/explanation/transports.md, "Signed webhooks".
"""

import base64
import re
import time
from collections.abc import Callable

from outbox_pipelines.core.settings.signing_secret import signing_keys, v1_signature

# Printable ASCII but "%" (and "."), inner spaces allowed: what header_id leaves as it is.
_PLAIN_WITH_DOTS = re.compile(r"[!-$&-~]+(?: +[!-$&-~]+)*")
_PLAIN = re.compile(r"[!-$&-\-/-~]+(?: +[!-$&-\-/-~]+)*")


def header_id(event_id: str, *, keep_dots: bool = True) -> str:
    """``event_id`` as an HTTP header carries it: unchanged when it is printable ASCII (inner spaces kept), else
    its UTF-8 bytes outside that, ``%`` (and ``.`` unless ``keep_dots``) and an edge space percent-encoded.
    Injective: two event_ids never give one header value."""
    if (_PLAIN_WITH_DOTS if keep_dots else _PLAIN).fullmatch(event_id):
        return event_id  # the usual id (a UUID, "inv-42"): as it is
    out = []
    last = len(event_id) - 1
    for index, char in enumerate(event_id):
        kept = "!" <= char <= "~" and char != "%" and (keep_dots or char != ".")
        if kept or (char == " " and 0 < index < last):
            out.append(char)
        else:
            out.append("".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass")))
    return "".join(out)


class WebhookSigner:
    """Adds the three Standard Webhooks headers to a request, from its exact body bytes."""

    def __init__(self, secret: str, clock: Callable[[], float] = time.time) -> None:
        self._keys = signing_keys(secret)
        self._clock = clock

    def headers(self, message_id: str, body: bytes) -> dict[str, str]:
        """The three headers for the message whose event_id is ``message_id``: the signature is over the id as
        the ``webhook-id`` header carries it (ASCII, no ``.``), the bytes a receiver's verifier reads."""
        sent_id = header_id(message_id, keep_dots=False)
        timestamp = str(int(self._clock()))
        signatures = " ".join(
            "v1," + base64.b64encode(v1_signature(key, sent_id.encode("ascii"), timestamp.encode(), body)).decode()
            for key in self._keys
        )
        return {"webhook-id": sent_id, "webhook-timestamp": timestamp, "webhook-signature": signatures}
