"""Seed 002 (Ghost style): MemberCreatedEvent → a welcome email, recorded in automated_email_recipients.

Serves the shipped ``outbox_members`` table (success deletes the row). The mailer is pluggable (``OUTBOX_MAILER``,
``use_mailer``); ``OUTBOX_WELCOME_EMAILS`` switches the topic. An event already recorded is skipped; the record
is written after the send, so a crash in between may send twice, never zero times.
"""

import logging
import os
import re
from email.message import EmailMessage
from pathlib import Path
from typing import Protocol

from outbox_pipelines.core.destinations.handlers import HandlerRegistry
from outbox_pipelines.core.errors import PermanentError
from outbox_pipelines.core.models import ClaimedMessage
from outbox_pipelines.core.storage import db

log = logging.getLogger("outbox_pipelines.members")
TOPIC = "MemberCreatedEvent"
EMAIL_TYPE = "welcome"
EMAIL_PATTERN = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,255}$")


class Mailer(Protocol):
    def send(self, message: EmailMessage) -> str: ...


class FolderMailer:
    """Writes each email to a .eml file (a local outbox folder); returns its path.

    Emails hold addresses and names: the files are 0600 in 0700 directories, for their owner only.
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.in_project = folder is None and not os.environ.get("OUTBOX_MAIL_DIR")
        self.folder = folder or Path(os.environ.get("OUTBOX_MAIL_DIR") or db.embedded_dir() / "mail")

    def send(self, message: EmailMessage) -> str:
        if self.in_project:
            db.private_embedded_dir(self.folder.parent)  # .outbox/ 0700 (made, or tightened if opened before)
        db.make_private_dirs(self.folder)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", str(message["X-Event-Id"]))[:100] + ".eml"
        path = self.folder / name
        db.write_private_file(path, bytes(message))
        return str(path)


class LogMailer:
    def send(self, message: EmailMessage) -> str:
        log.info("welcome email to member %s (event %s)", message["X-Member-Id"], message["X-Event-Id"])
        return "logged"


_mailer: Mailer = LogMailer() if os.environ.get("OUTBOX_MAILER") == "log" else FolderMailer()


def use_mailer(mailer: Mailer) -> None:
    global _mailer
    _mailer = mailer


def _database_url() -> str:
    return db.resolve_database(announce=False).url


def welcome_email(message: ClaimedMessage) -> str:
    payload = message.payload
    member_id, email, name = payload.get("member_id"), payload.get("email"), payload.get("name") or ""
    if not isinstance(member_id, (str, int)) or not isinstance(email, str) or not EMAIL_PATTERN.fullmatch(email):
        # Retrying cannot fix a malformed event: record it as dead with the reason.
        raise PermanentError("MemberCreatedEvent needs member_id and a valid email", code="BAD_PAYLOAD")
    with db.connect(_database_url()) as conn:
        already = conn.execute(
            "SELECT 1 FROM automated_email_recipients WHERE event_id = %s AND email_type = %s",
            (message.event_id, EMAIL_TYPE),
        ).fetchone()
        if already:
            return "already-sent"
        mail = EmailMessage()
        mail["To"] = email
        mail["Subject"] = f"Welcome{', ' + str(name) if name else ''}!"
        mail["X-Event-Id"] = message.event_id
        mail["X-Member-Id"] = str(member_id)
        mail.set_content(f"Hi {name or 'there'},\n\nwelcome aboard.\n")
        where = _mailer.send(mail)
        conn.execute(
            "INSERT INTO automated_email_recipients (member_id, email, email_type, event_id) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (event_id, email_type) DO NOTHING",
            (str(member_id), email, EMAIL_TYPE, message.event_id),
        )
    return where


registry = HandlerRegistry()
registry.register(TOPIC, welcome_email)
registry.set_enabled(TOPIC, os.environ.get("OUTBOX_WELCOME_EMAILS", "true").lower() not in ("0", "false", "off", "no"))
