"""The receivers of docs/how-to/verify-webhooks.md run as written: the page's ```python blocks are marked
``<!-- file: PATH -->``; the FastAPI app is served by Starlette's test client, the Django view by Django's in a
process of its own (its settings are global). Each accepts what our signer signs and refuses the rest with 400."""

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from outbox_pipelines.core.destinations.signing import WebhookSigner

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "how-to" / "verify-webhooks.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
MARKED = re.compile(r"^<!-- file: ([\w./-]+) -->\n```python\n(.*?)^```", re.M | re.S)
SECRET_ENV = "BILLING_HOOK_SECRET"


def _files() -> dict[str, str]:
    text = PAGE.read_text()
    files = dict(MARKED.findall(text))
    assert len(files) == len(BLOCK.findall(text)), f"{PAGE.name}: a python block without <!-- file: PATH -->"
    return files


FILES = _files()


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def deliveries(secret: str) -> list[tuple[str, dict[str, str], bytes]]:
    """(what it is, headers, body): one genuine delivery, then one of each kind a receiver refuses."""
    body = b'{"invoice": "inv-7", "amount": 12}'
    signer = WebhookSigner(secret)
    late = WebhookSigner(secret, clock=lambda: time.time() - 3600)
    return [
        ("genuine", signer.headers("evt-1", body), body),
        ("tampered", signer.headers("evt-2", body), body.replace(b"12", b"13")),
        ("another secret", WebhookSigner(new_secret()).headers("evt-3", body), body),
        ("replayed an hour later", late.headers("evt-4", body), body),
        ("unsigned", {}, body),
    ]


EXPECTED = {
    "genuine": (200, "accepted"),
    "tampered": (400, "matches the receiver's 1 secret"),
    "another secret": (400, "matches the receiver's 1 secret"),
    "replayed an hour later": (400, "s old, past the 300 s tolerance"),
    "unsigned": (400, "no webhook-id, webhook-timestamp, webhook-signature header"),
}


def test_the_page_shows_a_fastapi_and_a_django_receiver():
    assert sorted(FILES) == ["hooks/views.py", "receiver_fastapi.py"]


def test_the_fastapi_receiver_accepts_the_genuine_delivery_and_refuses_the_rest(tmp_path, monkeypatch):
    secret = new_secret()
    monkeypatch.setenv(SECRET_ENV, secret)
    source = tmp_path / "receiver_fastapi.py"
    source.write_text(FILES["receiver_fastapi.py"])
    spec = importlib.util.spec_from_file_location("docs_receiver_fastapi", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    answers = {}
    with TestClient(module.app) as client:
        for what, headers, body in deliveries(secret):
            response = client.post("/hooks/billing", content=body, headers=headers)
            answers[what] = (response.status_code, response.text)
    for what, (status, says) in EXPECTED.items():
        assert answers[what][0] == status, (what, answers[what])
        assert says in answers[what][1], (what, answers[what])
        assert secret.removeprefix("whsec_") not in answers[what][1]
    assert module.invoices == ["inv-7"]


DJANGO_DRIVER = """
import base64, json, sys
import django
from django.conf import settings

settings.configure(
    ROOT_URLCONF="urls", ALLOWED_HOSTS=["testserver"], SECRET_KEY="docs-test-only-" + "k" * 40,
    MIDDLEWARE=["django.middleware.common.CommonMiddleware", "django.middleware.csrf.CsrfViewMiddleware"],
)
django.setup()
from django.test import Client
from hooks import views

client = Client(enforce_csrf_checks=True)  # a real site checks CSRF: the view is exempt, the signature rules
answers = {}
for what, headers, body in json.load(sys.stdin):
    response = client.post(
        "/hooks/billing", data=base64.b64decode(body), content_type="application/json", headers=headers
    )
    answers[what] = [response.status_code, response.content.decode()]
answers["GET"] = [client.get("/hooks/billing").status_code, ""]
print(json.dumps({"answers": answers, "invoices": views.invoices}))
"""


def test_the_django_receiver_accepts_the_genuine_delivery_and_refuses_the_rest(tmp_path):
    secret = new_secret()
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "__init__.py").touch()
    (tmp_path / "hooks" / "views.py").write_text(FILES["hooks/views.py"])
    (tmp_path / "urls.py").write_text(
        "from django.urls import path\nfrom hooks.views import billing_hook\n"
        'urlpatterns = [path("hooks/billing", billing_hook)]\n'
    )
    (tmp_path / "driver.py").write_text(DJANGO_DRIVER)
    sent = [[what, headers, base64.b64encode(body).decode()] for what, headers, body in deliveries(secret)]
    env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")} | {SECRET_ENV: secret}
    done = subprocess.run(
        [sys.executable, "driver.py"],
        cwd=tmp_path,
        input=json.dumps(sent),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    answers = result["answers"]
    for what, (status, says) in EXPECTED.items():
        assert answers[what][0] == status, (what, answers[what])
        assert says in answers[what][1], (what, answers[what])
    assert answers["GET"][0] == 405
    assert result["invoices"] == ["inv-7"]
    assert secret.removeprefix("whsec_") not in done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(FILES))
def test_each_receiver_verifies_before_it_parses(name):
    """The page's rule, in its own code: the verify call comes before json.loads."""
    source = FILES[name]
    assert source.index(".verify(") < source.index("json.loads(")
