"""Flows that exit (sys.exit(), argparse's error(), KeyboardInterrupt), in a module that worker processes
import (LOOM_FLOW_MODULES=tests.exit_flows): each is a failure of its attempt, never a stuck execution."""

from __future__ import annotations

import argparse
import sys

from journal.flows import RetryPolicy, flow

CALLS: dict[str, int] = {}  # attempts of exits.retried per execution


@flow("exits.step_exit")
def step_exit(ctx, value):
    ctx.step("one", lambda: 1)
    return ctx.step("exit", sys.exit, value.get("code", 3))


@flow("exits.argparse")
def argparse_error(ctx, value):
    """A step parsing arguments it cannot: argparse's error() raises SystemExit(2)."""
    parser = argparse.ArgumentParser(prog="tool", exit_on_error=True)
    parser.add_argument("--count", type=int, required=True)
    return ctx.step("parse", lambda: vars(parser.parse_args(value["argv"])))


@flow("exits.interrupt")
def interrupt(ctx, value):
    """The flow's own code (not a step) raises KeyboardInterrupt after a step."""
    ctx.step("one", lambda: 1)
    raise KeyboardInterrupt("the flow interrupted itself")


def _exit_once(execution_id: str) -> int:
    CALLS[execution_id] = CALLS.get(execution_id, 0) + 1
    if CALLS[execution_id] == 1:
        sys.exit("first attempt exits")
    return CALLS[execution_id]


@flow("exits.retried")
def retried(ctx, value):
    """A policy that retries exits too: the second attempt runs and completes."""
    return ctx.step("once", _exit_once, ctx.execution_id,
                    retry=RetryPolicy(attempts=2, retry_on=(Exception, SystemExit)))


@flow("exits.then_ok")
def then_ok(ctx, value):
    return ctx.step("ok", lambda: value.get("n", 0))


CRASH = False  # exits.crash_then_exit dies (a simulated crash) in its second step while this is true


@flow("exits.crash_then_exit")
def crash_then_exit(ctx, value):
    """Its first run crashes mid-step; the run that recovers it finds a step that calls sys.exit()."""
    from tests.flows_fixtures import Crash

    def second():
        if CRASH:
            raise Crash("simulated crash mid-step")
        sys.exit(4)

    ctx.step("one", lambda: 1)
    return ctx.step("two", second)


@flow("exits.sleep_then_exit")
def sleep_then_exit(ctx, value):
    """Parks, so that the waker's run (not the start's) meets the exit."""
    ctx.sleep(value.get("seconds", 1.5))
    return ctx.step("exit", sys.exit, 5)
