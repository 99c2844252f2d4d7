"""``verify_webhook`` against the Standard Webhooks specification's own test vectors (the fixed ones of its
libraries' tests, copied verbatim), against its Python library both ways (it signs, we verify; we sign, it
verifies), and against our signer; each failure raises its own error, whose message holds no secret."""

import base64
import email.message
import os
from datetime import UTC, datetime, timedelta

import pytest
from django.http.request import HttpHeaders
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError as TheirVerificationError
from starlette.datastructures import Headers

from outbox_pipelines import (
    OutboxError,
    WebhookHeaderMissing,
    WebhookSecretInvalid,
    WebhookSignatureMalformed,
    WebhookSignatureMismatch,
    WebhookTimestampMalformed,
    WebhookTimestampTooNew,
    WebhookTimestampTooOld,
    WebhookVerificationError,
    WebhookVerifier,
    verify_webhook,
)
from outbox_pipelines.core.destinations.signing import WebhookSigner

# The fixed vector of the specification's libraries (python/tests/test_webhooks.py::test_sign_function,
# go/webhook_test.go::TestWebhookSign, javascript/src/webhook.test.ts "sign function works"), verbatim.
SPEC_KEY = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_SECRET = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # DEFAULT_SECRET: the same key without its prefix
SPEC_MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_PAYLOAD = '{"test": 2432232314}'
SPEC_EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
# Signatures the libraries' tests use as wrong ones, verbatim.
SPEC_WRONG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="  # python: test_invalid_signature_raises_error
SPEC_OTHER = "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="  # go: "invalid signature is invalid", multi sig
SPEC_OTHER_V2 = "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc="
SPEC_JS_INVALID = "v1,dawfeoifkpqwoekfpqoekf"  # javascript: "invalid signature throws error"
# The specification's example header (spec/standard-webhooks.md, "Webhook headers"): an asymmetric entry.
SPEC_V1A = "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZdpXwVLPo3mNl8EM+m7TBAg=="
AT_SIGNING = datetime.fromtimestamp(SPEC_TIMESTAMP, UTC)
TOLERANCE = timedelta(minutes=5)


def spec_headers(signature: str = SPEC_EXPECTED, timestamp: int = SPEC_TIMESTAMP) -> dict[str, str]:
    return {"webhook-id": SPEC_MSG_ID, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def verify_spec(headers: dict[str, str], body: str = SPEC_PAYLOAD, secret: str = SPEC_KEY, **kwargs) -> None:
    kwargs.setdefault("now", AT_SIGNING)
    verify_webhook(secret, headers, body.encode(), **kwargs)


# The specification's vectors.


def test_the_specifications_fixed_vector_verifies_with_and_without_the_prefix():
    verify_spec(spec_headers())
    verify_spec(spec_headers(), secret=SPEC_SECRET)
    # And what its library signs for it is that same signature (the vector is the library's own).
    assert Webhook(SPEC_KEY).sign(SPEC_MSG_ID, AT_SIGNING, SPEC_PAYLOAD) == SPEC_EXPECTED


def test_a_signature_one_character_off_does_not_match():
    with pytest.raises(WebhookSignatureMismatch):
        verify_spec(spec_headers(SPEC_WRONG))
    with pytest.raises(WebhookSignatureMismatch):
        verify_spec(spec_headers(SPEC_OTHER))


@pytest.mark.parametrize(
    "body", ['{"test": 2432232315}', '{"test":2432232314}', '{"test": 2432232314} ', '{"test": "2432232314"}']
)
def test_a_body_changed_in_any_way_does_not_match(body):
    with pytest.raises(WebhookSignatureMismatch, match="raw body bytes"):
        verify_spec(spec_headers(), body=body)


def test_the_id_and_the_timestamp_are_signed_too():
    with pytest.raises(WebhookSignatureMismatch):
        verify_spec({**spec_headers(), "webhook-id": SPEC_MSG_ID + "x"})
    with pytest.raises(WebhookSignatureMismatch):  # 1 s later: within the tolerance, but not what was signed
        verify_spec(spec_headers(timestamp=SPEC_TIMESTAMP + 1))


def test_several_signatures_verify_when_one_matches_whatever_its_place():
    """The libraries' multi-signature case, verbatim, plus the specification's own v1a entry."""
    verify_spec(spec_headers(" ".join([SPEC_OTHER, SPEC_OTHER_V2, SPEC_EXPECTED, SPEC_OTHER])))
    verify_spec(spec_headers(f"{SPEC_EXPECTED} {SPEC_V1A}"))
    verify_spec(spec_headers(f"{SPEC_V1A} {SPEC_EXPECTED}"))


def test_a_header_of_only_other_versions_has_no_signature_to_match():
    with pytest.raises(WebhookSignatureMismatch, match="no v1"):
        verify_spec(spec_headers(f"{SPEC_V1A} {SPEC_OTHER_V2}"))


@pytest.mark.parametrize(
    "signature",
    [
        SPEC_JS_INVALID,  # base64 of 18 bytes: never an HMAC-SHA256
        "v1,",  # go and javascript: "partial signature"
        SPEC_EXPECTED[:8],  # javascript: the valid signature cut to 8 characters
        SPEC_EXPECTED[3:],  # no version
        "v1:" + SPEC_EXPECTED[3:],
        f"{SPEC_EXPECTED},{SPEC_EXPECTED}",
        "v1,%%%%" + SPEC_EXPECTED[7:],
        f"{SPEC_EXPECTED} garbage",
    ],
)
def test_a_malformed_signature_list_says_so(signature):
    with pytest.raises(WebhookSignatureMalformed, match="entry [12] of webhook-signature"):
        verify_spec(spec_headers(signature))


@pytest.mark.parametrize("header", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_or_empty_header_is_named(header):
    without = {k: v for k, v in spec_headers().items() if k != header}
    with pytest.raises(WebhookHeaderMissing, match=f"no {header} header"):
        verify_spec(without)
    with pytest.raises(WebhookHeaderMissing, match=f"no {header} header"):
        verify_spec({**spec_headers(), header: "  "})


def test_every_missing_header_is_named_at_once():
    with pytest.raises(WebhookHeaderMissing, match="no webhook-id, webhook-timestamp, webhook-signature header"):
        verify_spec({"content-type": "application/json"})


@pytest.mark.parametrize("timestamp", ["hello", "1614265330.5", "-1614265330", "1e9", "١٦١٤٢٦٥٣٣٠", "1614265330000"])
def test_a_timestamp_that_is_not_whole_seconds_is_malformed(timestamp):
    headers = {**spec_headers(), "webhook-timestamp": timestamp}
    with pytest.raises(WebhookTimestampMalformed, match="not whole Unix seconds"):
        verify_spec(headers)


def test_a_timestamp_in_milliseconds_is_called_so():
    with pytest.raises(WebhookTimestampMalformed, match="milliseconds"):
        verify_spec({**spec_headers(), "webhook-timestamp": "1614265330000"})


def test_the_tolerance_is_five_minutes_either_way_inclusive():
    """The libraries refuse a timestamp older or newer than now by more than 5 minutes; exactly 5 passes."""
    verify_spec(spec_headers(), now=AT_SIGNING + TOLERANCE)
    verify_spec(spec_headers(), now=AT_SIGNING - TOLERANCE)
    with pytest.raises(WebhookTimestampTooOld, match="301 s old, past the 300 s tolerance"):
        verify_spec(spec_headers(), now=AT_SIGNING + TOLERANCE + timedelta(seconds=1))
    with pytest.raises(WebhookTimestampTooNew, match="301 s ahead of this receiver's clock"):
        verify_spec(spec_headers(), now=AT_SIGNING - TOLERANCE - timedelta(seconds=1))


def test_a_tolerance_of_ones_own():
    short = timedelta(seconds=10)
    verify_spec(spec_headers(), now=AT_SIGNING + short, tolerance=short)
    with pytest.raises(WebhookTimestampTooOld, match="11 s old, past the 10 s tolerance"):
        verify_spec(spec_headers(), now=AT_SIGNING + timedelta(seconds=11), tolerance=short)
    with pytest.raises(ValueError, match="must not be negative"):
        WebhookVerifier(SPEC_KEY, tolerance=timedelta(seconds=-1))


def test_without_now_the_system_clock_decides():
    """The vector was signed in 2021: today it is a replay."""
    with pytest.raises(WebhookTimestampTooOld):
        verify_webhook(SPEC_KEY, spec_headers(), SPEC_PAYLOAD.encode())


def test_a_forged_old_delivery_is_a_mismatch_not_a_replay():
    """The signature is checked before the clock: TooOld means a genuine delivery, late or replayed."""
    with pytest.raises(WebhookSignatureMismatch):
        verify_spec(spec_headers(SPEC_WRONG), now=AT_SIGNING + timedelta(days=1))


@pytest.mark.parametrize(
    ("unpadded", "padded"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),  # needs no padding
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaS="),  # needs one
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwBr", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwBr=="),  # needs two
    ],
)
def test_an_unpadded_secret_verifies_with_and_without_the_prefix(unpadded, padded):
    """python/tests: test_signature_verification_with_unpadded_secret; the reference library signs."""
    signature = Webhook(padded).sign(SPEC_MSG_ID, AT_SIGNING, SPEC_PAYLOAD)
    for secret in (unpadded, padded, "whsec_" + unpadded):
        verify_spec(spec_headers(signature), secret=secret)


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        ("", "empty"),
        ("whsec_", "at least 16 bytes"),  # the libraries: EmptyWebhookSecretError
        ("   ", "empty"),
        ("whsec_c2hvcnQ=", "16 bytes of key; this one holds 5"),
        ("whsec_%%%%notbase64", "not base64"),
        ([], "empty"),
        (b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "as text"),
        ([SPEC_KEY, 42], "as text"),
    ],
)
def test_a_bad_secret_is_refused_before_any_delivery(secret, says):
    with pytest.raises(WebhookSecretInvalid, match=says):
        WebhookVerifier(secret)
    with pytest.raises(WebhookSecretInvalid, match=says):
        verify_spec(spec_headers(), secret=secret)


def test_an_empty_body_verifies():
    """javascript: "empty payload returns undefined"."""
    signature = Webhook(SPEC_KEY).sign(SPEC_MSG_ID, AT_SIGNING, "")
    verify_spec(spec_headers(signature), body="")


# Every error is one kind, and says nothing secret.


def test_every_error_is_a_webhook_verification_error_an_outbox_error_and_a_value_error():
    kinds = [
        WebhookHeaderMissing,
        WebhookTimestampMalformed,
        WebhookTimestampTooOld,
        WebhookTimestampTooNew,
        WebhookSignatureMalformed,
        WebhookSignatureMismatch,
        WebhookSecretInvalid,
    ]
    assert len(set(kinds)) == 7
    for kind in kinds:
        assert issubclass(kind, WebhookVerificationError)
        assert issubclass(kind, OutboxError) and issubclass(kind, ValueError)
        assert not any(issubclass(kind, other) for other in kinds if other is not kind)


def test_no_message_holds_the_secret_or_the_expected_signature():
    secret = new_secret()
    signer = WebhookSigner(secret, clock=lambda: SPEC_TIMESTAMP)
    good = signer.headers("inv-1", b'{"a": 1}')
    expected = good["webhook-signature"]
    failures = [
        ({k: v for k, v in good.items() if k != "webhook-id"}, b'{"a": 1}', AT_SIGNING),
        ({**good, "webhook-timestamp": "soon"}, b'{"a": 1}', AT_SIGNING),
        ({**good, "webhook-signature": expected[:20]}, b'{"a": 1}', AT_SIGNING),
        (good, b'{"a": 2}', AT_SIGNING),
        (good, b'{"a": 1}', AT_SIGNING + timedelta(hours=1)),
        (good, b'{"a": 1}', AT_SIGNING - timedelta(hours=1)),
    ]
    messages = []
    for headers, body, now in failures:
        with pytest.raises(WebhookVerificationError) as raised:
            verify_webhook(secret, headers, body, now=now)
        messages.append(f"{raised.value} {raised.value!r}")
    with pytest.raises(WebhookSecretInvalid) as raised:
        WebhookVerifier(secret + " whsec_c2hvcnQ=")
    messages.append(str(raised.value))
    messages.append(repr(WebhookVerifier(secret)))
    for text in messages:
        for leak in (secret, secret.removeprefix("whsec_"), expected, expected.removeprefix("v1,")):
            assert leak not in text


def test_the_body_is_the_raw_bytes_not_a_string_nor_parsed_json():
    with pytest.raises(TypeError, match="raw request body as bytes"):
        verify_webhook(SPEC_KEY, spec_headers(), SPEC_PAYLOAD, now=AT_SIGNING)  # type: ignore[arg-type]
    verify_webhook(SPEC_KEY, spec_headers(), bytearray(SPEC_PAYLOAD.encode()), now=AT_SIGNING)
    verify_webhook(SPEC_KEY, spec_headers(), memoryview(SPEC_PAYLOAD.encode()), now=AT_SIGNING)


def test_now_is_timezone_aware():
    with pytest.raises(ValueError, match="timezone-aware"):
        verify_spec(spec_headers(), now=datetime(2021, 2, 25, 15, 2, 10))


# Headers as each framework gives them.


def _message_headers() -> email.message.Message:
    """http.server's self.headers."""
    message = email.message.Message()
    for name, value in spec_headers().items():
        message[name.title()] = value
    return message


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({k.upper(): v for k, v in spec_headers().items()}, id="dict-upper"),
        pytest.param({k.title(): v for k, v in spec_headers().items()}, id="dict-title"),
        pytest.param(Headers(headers={k.title(): v for k, v in spec_headers().items()}), id="starlette"),
        pytest.param(
            HttpHeaders({"HTTP_" + k.upper().replace("-", "_"): v for k, v in spec_headers().items()}), id="django"
        ),
        pytest.param(_message_headers(), id="http.server"),
        pytest.param([(k.encode(), v.encode()) for k, v in spec_headers().items()], id="asgi-raw"),
        pytest.param({k: f"  {v} " for k, v in spec_headers().items()}, id="padded-values"),
    ],
)
def test_headers_as_any_framework_gives_them(headers):
    verify_webhook(SPEC_KEY, headers, SPEC_PAYLOAD.encode(), now=AT_SIGNING)


# Both ways with the reference library, and with our signer.

BODIES = [b'{"invoice": "inv-1", "amount": 12}', '{"note": "naïve € 1/2", "emoji": "🎉"}'.encode(), b"", b"[]"]
IDS = ["msg_p5jXN8AQM9LWM0D4loKWxJek", "inv-0001", "3f2b9c1e-7a44-4d0e-9d8e-1c2b3a4d5e6f", "a%2Eb", "with space"]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("msg_id", IDS)
def test_what_the_reference_library_signs_we_verify(msg_id, body):
    secret = new_secret()
    now = datetime.now(UTC).replace(microsecond=0)
    signature = Webhook(secret).sign(msg_id, now, body.decode())
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature}
    verify_webhook(secret, headers, body)
    with pytest.raises(WebhookSignatureMismatch):
        verify_webhook(new_secret(), headers, body)


IDS_OURS = [*IDS, "заказ-42", "order.42.created", "100%-done", " edge ", "party-🎉"]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize("event_id", IDS_OURS)
def test_what_our_signer_signs_the_reference_library_and_we_verify(event_id, body):
    secret = new_secret()
    headers = WebhookSigner(secret).headers(event_id, body)
    assert Webhook(secret).verify(body, headers, json_parse=False) is None
    verify_webhook(secret, headers, body)
    with pytest.raises(TheirVerificationError):
        Webhook(new_secret()).verify(body, headers, json_parse=False)
    with pytest.raises(WebhookSignatureMismatch):
        verify_webhook(new_secret(), headers, body)


def test_a_non_ascii_id_from_another_sender_verifies_as_read_by_any_server():
    """A sender that signs a UTF-8 id: aiohttp reads it as UTF-8, WSGI and ASGI servers as Latin-1."""
    secret = new_secret()
    msg_id = "zürich-42"
    now = datetime.now(UTC).replace(microsecond=0)
    signature = Webhook(secret).sign(msg_id, now, "{}")
    for as_read in (msg_id, msg_id.encode().decode("latin-1")):
        headers = {
            "webhook-id": as_read,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        }
        verify_webhook(secret, headers, b"{}")


# A rotation: the sender signs with both secrets, the receiver knows one or both.


def test_during_a_rotation_a_receiver_knowing_either_secret_verifies():
    old, new = new_secret(), new_secret()
    headers = WebhookSigner(f"{old} {new}").headers("inv-9", b"{}")
    assert len(headers["webhook-signature"].split()) == 2
    for receiver in (old, new, f"{old} {new}", [new, old], (s for s in [old])):
        WebhookVerifier(receiver).verify(headers, b"{}")
    with pytest.raises(WebhookSignatureMismatch, match="none of the 2 v1 signature"):
        WebhookVerifier(new_secret()).verify(headers, b"{}")


def test_a_receiver_holding_both_secrets_verifies_a_sender_on_either():
    old, new = new_secret(), new_secret()
    verifier = WebhookVerifier([old, new])
    for sender in (old, new):
        verifier.verify(WebhookSigner(sender).headers("inv-9", b"{}"), b"{}")
    with pytest.raises(WebhookSignatureMismatch, match="receiver's 2 secret"):
        verifier.verify(WebhookSigner(new_secret()).headers("inv-9", b"{}"), b"{}")
