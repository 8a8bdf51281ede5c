"""LISTEN sessions (journal/listen.py) reach the server the way the application's own connection does:
the alias's OPTIONS (SSL, timeouts, application name...) and an empty HOST (a Unix socket) are kept, only
host and port are replaced by LOOM_DIRECT behind a transaction pooler, and a pooled alias without one
cannot listen (its callers poll)."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from journal.listen import CONNECT_TIMEOUT_S, KEEPALIVES, listen, session_params


@pytest.fixture
def alias_settings():
    """The default alias's settings dict, restored after the test (the tests edit it in place)."""
    saved = {key: (dict(value) if isinstance(value, dict) else value)
             for key, value in connections["default"].settings_dict.items()}
    yield connections["default"].settings_dict
    connections["default"].settings_dict.clear()
    connections["default"].settings_dict.update(saved)
    connections["default"].close()  # a session the test's options opened is not the next test's


@pytest.mark.postgres
def test_the_session_keeps_the_aliases_options_and_only_loom_direct_moves_host_and_port(alias_settings):
    alias_settings["OPTIONS"] = {**alias_settings["OPTIONS"], "sslmode": "disable", "application_name": "loom-x"}
    params = session_params("default")
    assert params["sslmode"] == "disable" and params["application_name"] == "loom-x"
    assert params["dbname"] == alias_settings["NAME"] and params["autocommit"] is True
    assert params["connect_timeout"] == CONNECT_TIMEOUT_S
    assert {k: params[k] for k in KEEPALIVES} == KEEPALIVES  # a silently dropped session is noticed
    alias_settings["OPTIONS"]["connect_timeout"] = 3
    assert session_params("default")["connect_timeout"] == 3  # the alias's own wins
    alias_settings["LOOM_DIRECT"] = {"HOST": "10.9.8.7", "PORT": 5999}
    moved = session_params("default")
    assert (moved["host"], moved["port"], moved["application_name"]) == ("10.9.8.7", 5999, "loom-x")


@pytest.mark.postgres
def test_an_empty_host_is_a_unix_socket_as_for_django_and_a_pooled_alias_without_direct_cannot_listen(
        alias_settings):
    alias_settings["HOST"] = ""
    assert "host" not in session_params("default")  # libpq's default, not 127.0.0.1
    alias_settings.pop("LOOM_DIRECT", None)
    alias_settings["DISABLE_SERVER_SIDE_CURSORS"] = True
    assert session_params("default") is None and listen("default", "loom_x") is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # the NOTIFY must commit to be delivered
def test_a_session_opened_with_the_aliases_options_listens(alias_settings):
    alias_settings["OPTIONS"] = {**alias_settings["OPTIONS"], "application_name": "loom-listen-test"}
    conn = listen("default", "loom_listen_test")
    assert conn is not None
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'loom-listen-test' "
                           "AND query LIKE 'LISTEN%%' AND datname = current_database()")
            assert cursor.fetchone()[0] == 1
            cursor.execute("NOTIFY loom_listen_test, 'hello'")
        assert [n.payload for n in conn.notifies(timeout=5, stop_after=1)] == ["hello"]
    finally:
        conn.close()
