"""The unit lane (``pytest -m unit``): the tests that need no database, server or process, marked so by
conftest.py from their fixtures; one of them that asks for the database fails rather than starting one."""

import pytest

from outbox_pipelines_tests.conftest import DATABASE_FIXTURES, NOT_UNIT_FIXTURES


@pytest.mark.parametrize("name", ["db_url", "conn"])  # pg_server first when no test has started it
def test_a_unit_test_that_asks_for_the_database_fails_and_starts_none(request: pytest.FixtureRequest, name) -> None:
    assert request.node.get_closest_marker("unit") is not None
    with pytest.raises(pytest.fail.Exception, match=r"is in the unit lane \(-m unit\), which starts no database"):
        request.getfixturevalue(name)


def test_no_test_of_the_lane_has_a_database_server_or_process_fixture(request: pytest.FixtureRequest) -> None:
    unit = [item for item in request.session.items if item.get_closest_marker("unit")]
    assert request.node in unit
    for item in unit:
        fixtures = set(getattr(item, "fixturenames", ()))
        assert fixtures.isdisjoint(NOT_UNIT_FIXTURES | DATABASE_FIXTURES), item.nodeid
        assert not {"slow", "drill", "soak", "browser"} & {mark.name for mark in item.iter_markers()}, item.nodeid
