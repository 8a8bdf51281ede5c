"""Example flows served by the API and validated by bench_http (registered when LOOM_API_EXAMPLES).

calc.add         {"a": 2, "b": 3} -> 5                               (two naturals)
calc.accumulate  {"input": {"n": 4}, "state": {"total": 5, "calls": 1}}
                 -> {"result": 9, "state": {"total": 9, "calls": 2}}  (caller-owned state, see loomapi/state.py)

Both are one-step flows: started durably they write an execution's events; called transiently
they write nothing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from journal.flows import Context, flow


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Naturals(_Strict):
    a: StrictInt = Field(ge=0)
    b: StrictInt = Field(ge=0)


class Addend(_Strict):
    n: StrictInt = Field(ge=0)


class Total(_Strict):
    total: StrictInt = Field(default=0, ge=0)
    calls: StrictInt = Field(default=0, ge=0)


class Accumulate(_Strict):
    """The caller-owned-state envelope: the call's input and the state the caller carries."""

    input: Addend
    state: Total


@flow("calc.add", input_model=Naturals)
def add(ctx: Context, numbers: Naturals) -> int:
    return ctx.step("add", lambda: numbers.a + numbers.b)


@flow("calc.accumulate", input_model=Accumulate)
def accumulate(ctx: Context, call: Accumulate) -> dict:
    total = ctx.step("add", lambda: call.state.total + call.input.n)
    return {"result": total, "state": {"total": total, "calls": call.state.calls + 1}}
