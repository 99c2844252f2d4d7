"""``db grant`` gives the roles their rights on every inbox table: the producer (an application) receives, the
maintainer (the cleaner) deletes, the reader reads; none may do more."""

import psycopg
import pytest

from outbox_pipelines import Inbox
from outbox_pipelines.core.storage import roles
from outbox_pipelines_tests.core.storage.test_roles import _denied


@pytest.fixture
def granted(db_url: str, inbox_table: str) -> str:
    """The roles granted once the inbox exists (as `db grant` after `db upgrade`)."""
    roles.grant_roles(db_url)
    return db_url


def test_the_producer_receives_and_may_neither_change_nor_delete(login_as, conn) -> None:
    url = login_as(roles.PRODUCER)
    with psycopg.connect(url) as consumer:
        assert Inbox("billing_inbox").receive(consumer, "m-1", consumer="billing")
        consumer.commit()
        assert not Inbox("billing_inbox").receive(consumer, "m-1", consumer="billing")
        consumer.commit()
    assert _denied(url, "DELETE FROM billing_inbox")
    assert _denied(url, "UPDATE billing_inbox SET received_at = now()")


def test_the_maintainer_deletes_and_the_reader_only_reads(login_as, conn) -> None:
    maintainer, reader = login_as(roles.MAINTAINER), login_as(roles.READER)
    assert not _denied(maintainer, "DELETE FROM billing_inbox")
    assert _denied(maintainer, "INSERT INTO billing_inbox (consumer, message_id) VALUES ('c', 'm')")
    assert not _denied(reader, "SELECT * FROM billing_inbox")
    assert _denied(reader, "DELETE FROM billing_inbox")


def test_the_rights_are_printed_for_every_inbox_table(granted) -> None:
    by_name = {spec.name: spec for spec in roles.all_roles()}
    assert "SELECT, INSERT on every inbox table" in roles.rights(by_name[roles.PRODUCER])
    assert "SELECT, DELETE on every inbox table" in roles.rights(by_name[roles.MAINTAINER])
    with psycopg.connect(granted) as conn:
        assert roles.plan_grants(conn).inbox_tables == ["billing_inbox"]
