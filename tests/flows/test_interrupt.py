"""Interruptible steps in one process, on both backends (journal/flows/interrupt.py, leases/watchdog.py):
heartbeat() and cancelled() from inside a step, a timeout told at the heartbeat, bad bounds refused before the
step starts, and the watchdog's rules (tell, hand a silent step's lease back, retire past the bound). The
same with real worker processes: tests/flows/test_interrupt_processes.py and tests/admin/test_browser_interrupt.py."""

from __future__ import annotations

import threading
import time

import pytest

from journal.flows import events as ev
from journal.flows import flow, interrupt, start
from journal.flows import ownership as own
from journal.flows.errors import StepCancelled
from journal.models import Event
from leases.watchdog import StepWatchdog

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_leases():
    installed = own.get_ownership()
    own.set_ownership(None)  # the runtime's side; leases have their own suites
    yield
    own.set_ownership(installed)


SEEN: dict[str, object] = {}


@flow("interrupt.test.patient")
def patient(ctx, value):
    def work() -> str:
        SEEN["inside"] = (interrupt.current() is not None, interrupt.cancelled())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            interrupt.heartbeat({"left": deadline - time.monotonic()})  # the module function: no ctx needed
            time.sleep(0.01)
        return "a whole 30 s"

    return ctx.step("work", work, timeout=value["timeout"])


@flow("interrupt.test.bad_bound")
def bad_bound(ctx, value):
    return ctx.step("never", lambda: 1, heartbeat_timeout=value["heartbeat_timeout"])


def test_outside_a_step_heartbeat_does_nothing_and_nothing_is_cancelled():
    interrupt.heartbeat({"x": 1})
    assert interrupt.cancelled() is False and interrupt.current() is None


def test_a_running_step_is_told_of_its_timeout_at_its_heartbeat_and_the_attempt_fails_as_timed_out():
    out = start("interrupt.test.patient", {"timeout": 0.3}, execution_id="int-patient")
    assert out.status == "failed" and "ran past its timeout" in out.error
    assert SEEN["inside"] == (True, False)
    failed = [e.payload for e in Event.objects.read("int-patient") if e.type == ev.STEP_FAILED]
    assert len(failed) == 1 and failed[0]["timeout"] is True
    assert ev.STEP_COMPLETED not in [e.type for e in Event.objects.read("int-patient")]
    assert interrupt.running_steps() == []


@pytest.mark.parametrize("bad", [-1, -0.5, "1", True, [2]])
def test_a_bad_heartbeat_timeout_is_refused_before_the_step_starts(bad):
    out = start("interrupt.test.bad_bound", {"heartbeat_timeout": bad}, execution_id="int-bad")
    assert out.status == "failed" and "InvalidInput: heartbeat_timeout of step 'never'" in out.error
    assert ev.STEP_STARTED not in [e.type for e in Event.objects.read("int-bad")]


class FakeClaim:
    def __init__(self):
        self.lost = False
        self.handed_back = 0

    def hand_back(self):
        self.handed_back += 1
        self.lost = True


def run_in_thread(claim, heartbeat_timeout=None, timeout=None):
    """A step that sits in interrupt.running until told, then heartbeats once; what its heartbeat raised."""
    entered, result = threading.Event(), {}

    def body():
        with interrupt.running("int-x", "s", 0, 1, claim, timeout, heartbeat_timeout) as step:
            result["step"] = step
            entered.set()
            while step.reason is None:
                time.sleep(0.01)
            try:
                interrupt.heartbeat()
            except Exception as exc:
                result["raised"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert entered.wait(10)
    return thread, result


def test_the_watchdog_hands_a_silent_steps_lease_back_and_tells_it():
    claim = FakeClaim()
    retired = []
    watchdog = StepWatchdog(retire=retired.append)
    thread, result = run_in_thread(claim, heartbeat_timeout=5.0)
    step = result["step"]
    watchdog.check(now=step.last_beat + 1.0)  # within its heartbeat timeout: nothing
    assert step.reason is None and claim.handed_back == 0
    watchdog.check(now=step.last_beat + 6.0)
    thread.join(10)
    assert claim.handed_back == 1 and isinstance(result["raised"], StepCancelled) and retired == []


def test_the_watchdog_retires_the_worker_when_a_told_step_ignores_it_past_the_bound(settings):
    settings.LOOM_STEP_ABANDON_AFTER = 2.0
    claim = FakeClaim()
    retired = []
    watchdog = StepWatchdog(retire=retired.append)
    entered, release = threading.Event(), threading.Event()

    def ignores():
        with interrupt.running("int-y", "s", 0, 1, claim, None, None):
            entered.set()
            release.wait(10)  # never heartbeats

    thread = threading.Thread(target=ignores, daemon=True)
    thread.start()
    assert entered.wait(10)
    claim.lost = True  # a cancel moved the fence: the keeper's renewal said so
    step = interrupt.running_steps()[0]
    watchdog.check(now=time.monotonic())
    assert step.reason == interrupt.CANCELLED and retired == []
    watchdog.check(now=step.told_at + 1.0)
    assert retired == []
    watchdog.check(now=step.told_at + 2.5)
    assert len(retired) == 1 and "LOOM_STEP_ABANDON_AFTER" in retired[0]
    assert interrupt.abandoned_threads() == {thread}
    release.set()
    thread.join(10)
    assert interrupt.abandoned_threads() == set() and interrupt.running_steps() == []
