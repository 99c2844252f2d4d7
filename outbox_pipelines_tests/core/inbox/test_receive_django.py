"""``Inbox.receive`` on Django's own connection, in a real Django process: inside ``transaction.atomic()`` the record
commits and rolls back with the models, a repeat is False; outside it, it is refused and nothing is recorded."""

import json

from outbox_pipelines_tests.core.test_enqueue_django import _run


def test_inside_atomic_once_and_rolled_back_with_the_work_outside_refused(db_url, conn, inbox_table):
    done = _run(
        db_url,
        """
        from outbox_pipelines import Inbox, NoTransaction
        inbox = Inbox("billing_inbox")
        said = []
        with transaction.atomic():
            said.append(inbox.receive(connection, "m-1", consumer="billing"))
            with connection.cursor() as cur:
                cur.execute("INSERT INTO effects VALUES ('m-1')")
        with transaction.atomic():
            said.append(inbox.receive(connection, "m-1", consumer="billing"))
        try:
            with transaction.atomic():
                said.append(inbox.receive(connection, "m-2", consumer="billing"))
                raise RuntimeError("the view failed")
        except RuntimeError:
            pass
        try:
            inbox.receive(connection, "m-3", consumer="billing")
        except NoTransaction as exc:
            said.append(str(exc))
        print(json.dumps(said))
        """,
    )
    assert done.returncode == 0, done.stderr
    first, repeat, rolled_back, refused = json.loads(done.stdout)
    assert [first, repeat, rolled_back] == [True, False, True]
    assert "outside a transaction" in refused and "transaction.atomic()" in refused
    rows = conn.execute("SELECT message_id FROM billing_inbox ORDER BY 1").fetchall()
    assert [row["message_id"] for row in rows] == ["m-1"]
    assert [row["message_id"] for row in conn.execute("SELECT message_id FROM effects")] == ["m-1"]
