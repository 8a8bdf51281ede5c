"""A flow raising a BaseException in a transient API call, against a real serve_api (issue 25): before,
`sys.exit` in a flow (or in a module it imports: one request naming `venv.__main__` did it through
loom.task) ended the API worker process; now it is a failed outcome naming the exception, and the same
worker process answers the next request."""

from __future__ import annotations

import os

import pytest

from loomapi.process import children
from tests.api.test_api_server import Server, request, server_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("timeout", ["30", ""])  # on the call pool, and in the request thread (no bound)
def test_a_flow_that_exits_is_a_failed_call_and_the_worker_process_stays(child_env, timeout):
    env = server_env(child_env, LOOM_FLOW_MODULES="tests.fixtures.api_flows,tests.fixtures.api_exit_flows",
                     LOOM_API_CALL_TIMEOUT=timeout)
    server = Server(env, 1)
    try:
        (worker,) = server.workers
        conn = server.connection()
        for name, value, raised in (("tests.exits.system_exit", 3, "SystemExit"),
                                    ("tests.exits.keyboard_interrupt", "stop", "KeyboardInterrupt"),
                                    ("tests.exits.at_import", None, "SystemExit")):
            status, body, served_by = request(conn, "POST", f"/api/flows/{name}/call", {"input": value})
            assert (status, body["status"], body["result"]) == (200, "failed", None), body
            assert body["error"].startswith(raised), body
            assert int(served_by) == worker
            status, body, served_by = request(conn, "POST", "/api/flows/calc.add/call", {"input": {"a": 1, "b": 2}})
            assert (status, body["result"], int(served_by)) == (200, 3, worker)
        conn.close()
        os.kill(worker, 0)  # still alive (ProcessLookupError otherwise)
        assert server.process.poll() is None and set(children(server.process.pid)) >= {worker}
    finally:
        server.stop()


def test_an_input_validator_that_exits_is_a_500_and_the_worker_process_stays(child_env):
    """A durable start checks its input in the API process (the flow's input model): a validator calling
    sys.exit there is a 500 naming nothing but an error id, and the same worker answers the next request."""
    env = server_env(child_env, LOOM_FLOW_MODULES="tests.fixtures.api_flows,tests.fixtures.api_exit_flows")
    server = Server(env, 1)
    try:
        (worker,) = server.workers
        conn = server.connection()
        status, body, served_by = request(conn, "POST", "/api/flows/tests.exits.at_validation/executions",
                                          {"input": {"code": 4}})
        assert (status, body["error"]["code"], int(served_by)) == (500, "internal_error", worker), body
        status, body, served_by = request(conn, "POST", "/api/flows/calc.add/call", {"input": {"a": 1, "b": 2}})
        assert (status, body["result"], int(served_by)) == (200, 3, worker)
        conn.close()
        os.kill(worker, 0)
    finally:
        server.stop()
