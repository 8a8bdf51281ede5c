"""Review (wave 15, engineer h): three gaps around "the database cannot be reached". psycopg 3's own texts for a
session the server dropped ("the connection is lost", "connection socket closed", "connection is bad") were not
taken for an unreachable server (journal/reach.py), while a socket this process closed (EBADF) must stay a bug;
`manage.py loom`'s exit 4 probed each database with ensure_connection, which keeps an open-but-dead connection,
so the database the server dropped was missing from `unreachable`; and loom_scrape_database_ok said 1 for an
alias whose queue or projection gauges could not be read (only the executions' read set it)."""

from __future__ import annotations

import errno

import psycopg
import pytest
from django.db import OperationalError, connection

from journal import telemetry
from journal.cli import unreachable as refusal
from journal.reach import cannot_reach
from tests.leases.test_failover import _closed_port, unreachable  # noqa: F401  (the fixture)


def _as_django_raises(error: BaseException) -> BaseException:
    """psycopg's error raised through Django's wrapper, as a query on a dropped session gives it to us."""
    try:
        with connection.wrap_database_errors:
            raise error
    except Exception as exc:  # what the wrapper made of it
        return exc
    raise AssertionError("not raised")


def _from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as exc:
        return exc


@pytest.mark.postgres
@pytest.mark.parametrize("text", ["the connection is lost", "connection socket closed",
                                  "connection is bad: no error details available"])
def test_psycopgs_texts_for_a_dropped_session_are_unreachable(text):
    """The exact texts psycopg/pq/pq_ctypes.py, waiting.py and generators.py raise for a server gone."""
    hung_up = _from(psycopg.OperationalError(text), OSError(errno.ECONNRESET, "reset"))
    raised = _as_django_raises(hung_up)
    assert isinstance(raised, OperationalError) and cannot_reach(raised)


@pytest.mark.postgres
def test_a_socket_this_process_closed_is_a_bug_not_an_unreachable_server():
    """waiting.py's fstat on a descriptor closed here (EBADF): retrying would not mend it, so not unreachable."""
    ours = _as_django_raises(_from(psycopg.OperationalError("connection socket closed"),
                                   OSError(errno.EBADF, "Bad file descriptor")))
    assert not cannot_reach(ours)


def _drop_session() -> None:
    """The server ends this connection's session (as a failover or a restart does), from another session."""
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    with psycopg.connect(host=params.get("host"), port=params.get("port"), user=params.get("user"),
                         dbname=params["dbname"], autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_exit_4_names_a_database_whose_open_connection_the_server_dropped(unreachable):  # noqa: F811
    connection.ensure_connection()
    _drop_session()  # the session is gone, the connection still open on our side ...
    connection.settings_dict["PORT"] = str(_closed_port())  # ... and the server is still gone (the fixture restores)
    said = refusal(OperationalError("server closed the connection unexpectedly"))
    assert said.code == 4 and said.data["unreachable"] == ["default"], said  # was []: ensure_connection kept it
    assert connection.connection is None  # the dead one was closed, not left behind


@pytest.fixture
def dropped_session_closed():
    """The connection closed after the test, so a dead session it failed to mend is not the next test's."""
    yield
    connection.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_exit_4_probe_leaves_a_live_connection_when_the_server_is_back(dropped_session_closed):
    connection.ensure_connection()
    _drop_session()
    said = refusal(OperationalError("server closed the connection unexpectedly"))
    assert said.data["unreachable"] == [], said
    with connection.cursor() as cursor:  # the dead session was not left behind for the next verb
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


def _scraped() -> dict[str, dict[tuple, float]]:
    return {family.name: {tuple(sorted(s.labels.items())): s.value for s in family.samples}
            for family in telemetry.DatabaseCollector().collect()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("table", ["queues_entry", "projections_subscription"])
def test_database_ok_is_0_when_the_queue_or_projection_gauges_could_not_read_the_alias(table):
    """The executions read, the queue (or projection) gauges not: the flag says 0, not 1 beside missing gauges."""
    from journal.flows import start
    from tests.fixtures import telemetry_flows  # noqa: F401  (registers the flows)

    start("telemetry.double", 1, execution_id="rev-h-ok-1")
    assert _scraped()["loom_scrape_database_ok"] == {(("alias", "default"),): 1}
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {table}_gone")
    try:
        seen = _scraped()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table}_gone RENAME TO {table}")
    assert seen["loom_executions"], seen  # the executions were read ...
    assert seen["loom_scrape_database_ok"] == {(("alias", "default"),): 0}, seen  # ... was 1


@pytest.mark.django_db(transaction=True)
def test_a_source_that_fails_as_a_whole_sets_every_alias_to_0(monkeypatch):
    def broken():
        yield from ()
        raise RuntimeError("a bug in a gauge source")

    monkeypatch.setattr(telemetry, "SOURCES", [*telemetry.SOURCES, broken])
    assert _scraped()["loom_scrape_database_ok"] == {(("alias", "default"),): 0}
