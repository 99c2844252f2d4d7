"""A webhook receiver that makes each delivery's effect happen once: the signature verified, then the inbox record
and the effect committed in one transaction, and 200 answered only after it (any failure: 500, and the relay sends
the message again; an id the inbox refuses: 400). Standard library and psycopg only. docs/how-to/consumers.md.

Run: DATABASE_URL=postgresql://... WEBHOOK_SECRET=whsec_... PORT=8080 python webhook_receiver.py
"""

import os
import queue
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

from outbox_pipelines import Inbox, InvalidMessage, WebhookVerificationError, WebhookVerifier

INBOX = Inbox("shipping_inbox")  # declared in outbox.toml as [inboxes.shipping_inbox], created by `db upgrade`
CONSUMER = "shipping"
VERIFIER = WebhookVerifier(os.environ["WEBHOOK_SECRET"])  # the sender's signing_secret_env value
CONNECTIONS: "queue.Queue[psycopg.Connection]" = queue.Queue()


@contextmanager
def connection() -> Iterator[psycopg.Connection]:
    conn = CONNECTIONS.get()
    try:
        if conn.broken or conn.closed:  # the database restarted: a new connection in its place
            conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        yield conn
    finally:
        CONNECTIONS.put(conn)


def handle(conn: psycopg.Connection, event_id: str, body: bytes) -> bool:
    """Record the message and do its work in one transaction; False (and nothing done) for a repeat."""
    with conn.transaction():
        if not INBOX.receive(conn, event_id, consumer=CONSUMER):
            return False  # handled before: the relay sent it again (its answer was lost, or the relay restarted)
        conn.execute("INSERT INTO shipments (event_id, payload) VALUES (%s, %s::jsonb)", (event_id, body.decode()))
        return True


class Receiver(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # the relay keeps its connections open between deliveries
    disable_nagle_algorithm = True  # the answer goes out at once, not after the client's delayed ACK

    def do_POST(self) -> None:  # http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            # The raw bytes, before any parsing; what it returns is the message's id, its event_id (the webhook-id
            # header decoded), the id a broker consumer reads too.
            event_id = VERIFIER.verify(self.headers.items(), body)
        except WebhookVerificationError as exc:
            return self.answer(400, str(exc))
        try:
            with connection() as conn:
                new = handle(conn, event_id, body)  # committed when it returns
        except InvalidMessage as exc:  # an id the inbox refuses: sending it again would change nothing
            return self.answer(400, str(exc))
        except Exception:  # the database, or a bug: nothing was committed, so the relay sends it again
            return self.answer(500, "not handled: send it again")
        print(f"{'new' if new else 'duplicate'} {event_id}\n", end="", flush=True)  # one write: threads share stdout
        self.answer(200, "handled" if new else "already handled")

    def answer(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    for _ in range(8):  # at most 8 deliveries handled at once, each on a connection of its own
        CONNECTIONS.put(psycopg.connect(os.environ["DATABASE_URL"], autocommit=True))
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ.get("PORT", "8080"))), Receiver)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    main()
