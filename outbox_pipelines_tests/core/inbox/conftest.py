import pytest

from outbox_pipelines.core.inbox.schema import create_inbox
from outbox_pipelines_tests.core.storage.test_roles import login_as  # noqa: F401 (a fixture: a login in a group role)


@pytest.fixture
def inbox_table(db_url: str, conn) -> str:
    """A created inbox table, ``billing_inbox``, and a business table ``effects`` for a consumer's work."""
    create_inbox(db_url, "billing_inbox")
    conn.execute("CREATE TABLE effects (message_id text PRIMARY KEY)")
    return "billing_inbox"
