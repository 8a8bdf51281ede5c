"""Caller-owned state: the API's convention for flows that carry state between calls.

The runtime has no sessions, and the server keeps nothing between calls, so any worker can
serve any call. A caller that wants state owns it and sends it with every call:

    request   {"input": <input>, "state": {...}}
    the flow  receives {"input": <input>, "state": {...}} as its input (validated by its input_model)
              and returns {"result": <result>, "state": {...}}
    response  {"result": <result>, "state": {...}}

Without "state" in the body, the flow receives <input> itself and its return value is the result.
A stateful flow called without state (or a stateless one called with it) fails its own input
validation: 422 invalid_input. A stateful flow that does not return {"result", "state": object}
breaks the convention: that is a server-side bug, answered 500 and logged.
"""

from __future__ import annotations

from typing import Any

from loomapi.bodies import CallBody


class StateContractBroken(RuntimeError):
    """A flow called with caller-owned state did not return {"result": ..., "state": {...}}."""


def flow_input(body: CallBody) -> Any:
    """What the flow receives for this body."""
    if body.has_state:
        return {"input": body.input, "state": body.state}
    return body.input


def split_result(flow_name: str, body: CallBody, value: Any) -> dict:
    """The response fields for the flow's return value: {"result"} or {"result", "state"}."""
    if not body.has_state:
        return {"result": value}
    if not (isinstance(value, dict) and set(value) == {"result", "state"} and isinstance(value["state"], dict)):
        raise StateContractBroken(
            f"flow {flow_name!r} was called with caller-owned state but returned "
            f"{type(value).__name__} instead of {{'result': ..., 'state': {{...}}}}")
    return {"result": value["result"], "state": value["state"]}
