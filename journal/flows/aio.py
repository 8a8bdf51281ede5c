"""Async flows: `async def` flows and steps on one event loop per process, and awaitable faces for callers.

    @flow("orders.ship")
    async def ship(ctx, order):
        label = await ctx.step("label", fetch_label, order["id"])   # a coroutine function, awaited
        await ctx.sleep(30)                                           # parks like a sync sleep
        await ctx.sleep(0.5)                                          # under astart: slept on the loop
        return await ctx.step("notify", send_mail, label)            # a plain function: a thread runs it

How it runs (docs/flows.md "Async flows"). The journal is the sync one, unchanged. Only the flow's own code runs as
a coroutine, on this process's event loop (one daemon thread, `loop()`); every journal call it makes (a step's
records, a wait's, a message's consumption) runs sync code in a thread, in one of two ways:

- THREAD-DRIVEN (a sync start/resume/retry: a worker's waker or recovery thread, a test, a caller's thread):
  `Runner.drive` runs in that DRIVE THREAD and serves the coroutine's calls (`_Driver`) until the run settles or
  parks. The thread and its connection are the run's throughout (a test's transaction works); a short in-process
  wait (under LOOM_WAIT_INLINE_MAX) sleeps in it.
- LOOP-DRIVEN (`astart`, `aresume`, a worker's queued async runs): the start runs in a thread of this module's pool;
  `Runner.drive` hands the async run back (`hand_back`) and the face drives it on the loop (`Runner.adrive`, the
  same decisions), each journal call in whichever pool thread is free (`_PooledDriver`). Between calls no thread is
  the run's, so a short sleep, the rest of a scheduled start's delay and a step's retry backoff are slept on the
  loop (`nap`), holding no thread and no connection. A call is whole in one thread: no transaction spans two; the
  fence token travels in the run's handle, so a cancel or takeover meanwhile is refused at the run's next write, as
  ever.

Either way
- Django's async-safety holds: no database access ever happens on the event loop; the coroutine runs in a copy of
  the driver's context (its shard binding);
- the events are the sync runtime's, byte for byte (2n+2 for n steps), with the same exactly-once and
  recovery rules: a resume of an async execution on any worker replays it like a sync one;
- a coroutine step runs on the loop: thread-driven while its drive thread waits for it, loop-driven with no thread
  waiting (`DurableContext.step_naps(awaits=True)` yields the call; its segments and the coroutine share one
  context, so ctx.cancelled() finds the step); a sync step function runs in the drive or a pool thread (never on
  the loop); `atomic=True` needs a sync function (its effects and its record commit in one
  transaction of that thread's connection; a coroutine's database work would run elsewhere).

Costs, stated: a RUNNING thread-driven execution holds its drive thread (idle while its coroutine awaits, asleep in
a short wait), as a sync one does; a loop-driven one holds a pool thread only during each journal call (and while a
step's sync function runs), so a burst of them is served at the pool's pace; a WAITING one holds none (waits of
LOOM_WAIT_INLINE_MAX or longer park, as in a sync flow). A worker drives its queued async runs loop-driven
(queues/loop.py: `begin_driven` + `drive_handed`), those its waker and recovery sweep resume thread-driven. The
awaitable faces (`astart`, `aresume`, `acancel`, `asend`, `adescribe`) run the sync call in a thread of a pool of
LOOM_ASYNC_DB_THREADS threads (one connection each at most, counted by leases/budget.py), so an async view never
touches the database on its loop; `aget_event` holds NO thread while it waits: it reads in the pool and sleeps on
the loop, woken by the process's one shared LISTEN session on PostgreSQL (journal/flows/event_listener.py) or by its
poll of LOOM_WAIT_POLL on SQLite. `stats()` counts what is held now.

Why a dedicated pool and not `sync_to_async(thread_sensitive=True)`: under Django's ASGI handler each request
has a thread-sensitive context of its own, so 1,000 waiting callers would hold 1,000 threads and connections;
thread_sensitive=False uses the loop's default executor, whose size is not ours to budget. The pool's size is
a setting, its connections a known figure.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from django.db import close_old_connections, connections

from journal import conf, telemetry
from journal.flows.context import Awaited, DurableContext, check_moment, check_seconds, now
from journal.flows.errors import InvalidInput
from journal.reach import cannot_reach

# == the process's event loop ===========================================================================
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid: int | None = None
_loop_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for flow code (a daemon thread `loom-aio`, started on first use; a forked
    child starts its own)."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid() or _loop.is_closed():
            ready = threading.Event()
            created = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(created)
                created.call_soon(ready.set)
                created.run_forever()

            threading.Thread(target=run, name="loom-aio", daemon=True).start()
            ready.wait()
            _loop, _loop_pid = created, os.getpid()
        return _loop


def is_async(fn: Any) -> bool:
    """Whether `fn` is an `async def` function (a coroutine function)."""
    return inspect.iscoroutinefunction(fn)


def _copy_outcome(finished: asyncio.Task, done: concurrent.futures.Future) -> None:
    """A loop task's outcome (result, exception or cancellation) onto the future a thread waits on."""
    if finished.cancelled():
        done.cancel()
    elif finished.exception() is not None:
        done.set_exception(finished.exception())
    else:
        done.set_result(finished.result())


def _submit(coro: Coroutine, context: contextvars.Context) -> concurrent.futures.Future:
    """Run `coro` on the process loop in `context` (the caller's contextvars: its shard binding, its step)."""
    target = loop()
    try:
        if asyncio.get_running_loop() is target:
            coro.close()
            raise RuntimeError("a sync flow call (start, resume, a step) was made from the loop that runs async "
                               "flow code: await its async face instead (astart, aresume, ...)")
    except RuntimeError as exc:
        if "no running event loop" not in str(exc):
            raise
    done: concurrent.futures.Future = concurrent.futures.Future()

    def begin() -> None:
        target.create_task(coro, context=context).add_done_callback(lambda finished: _copy_outcome(finished, done))

    target.call_soon_threadsafe(begin)
    return done


# == the drive thread's side =============================================================================
_DRIVER: contextvars.ContextVar[_Driver | None] = contextvars.ContextVar("loom_aio_driver", default=None)
_STOP = object()


class _Driver:
    """The drive thread of one async run: it serves the journal calls its coroutine sends back."""

    __slots__ = ("requests",)
    releases = False  # the run holds its drive thread to the end: an in-process wait sleeps in it

    def __init__(self):
        self.requests: queue.SimpleQueue = queue.SimpleQueue()

    async def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run `fn` in the drive thread (in a copy of this coroutine's context) and await its result."""
        running = asyncio.get_running_loop()
        answer = running.create_future()
        self.requests.put((fn, args, kwargs, contextvars.copy_context(), running, answer))
        return await answer

    def serve(self, done: concurrent.futures.Future) -> Any:
        """Until the coroutine finished: run what it sends, then its result (or its exception)."""
        done.add_done_callback(lambda _: self.requests.put(_STOP))
        while True:
            item = self.requests.get()
            if item is _STOP:
                return done.result()
            fn, args, kwargs, context, running, answer = item
            try:
                value = context.run(fn, *args, **kwargs)
            except BaseException as exc:  # Halt, Park, a flow's error: raised where the coroutine awaits
                running.call_soon_threadsafe(_reject, answer, exc)
            else:
                running.call_soon_threadsafe(_resolve, answer, value)


class _PooledDriver:
    """The journal calls of a run driven from the loop (Runner.adrive): each in whichever pool thread is free,
    in a copy of the coroutine's context (its shard binding). No thread belongs to the run between two calls,
    so an in-process wait is slept on the loop. Each call is whole in one thread: a transaction (an atomic
    step, a recv's consumption with its record) never spans two; the fence token travels in the RunHandle."""

    __slots__ = ()
    releases = True

    async def call(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        return await in_pool(fn, *args, **kwargs)


_POOLED = _PooledDriver()


def _resolve(answer: asyncio.Future, value: Any) -> None:
    if not answer.done():
        answer.set_result(value)


def _reject(answer: asyncio.Future, exc: BaseException) -> None:
    if not answer.done():
        answer.set_exception(exc)


def run_flow(ctx: AsyncDurableContext, flow, value: Any) -> Any:
    """Runner.drive's call of an async flow: its coroutine on the process loop, this thread serving its journal
    calls; returns its result or raises what it raised (Park, ContinueAsNew, Halt, a failure), as `flow.fn`
    would in a sync flow."""
    driver = _Driver()
    context = contextvars.copy_context()
    context.run(_DRIVER.set, driver)
    return driver.serve(_submit(flow.fn(ctx, value), context))


async def run_here(ctx: AsyncDurableContext, flow, value: Any) -> Any:
    """Runner.adrive's call of the flow: its coroutine awaited on this loop, its journal calls in the pool."""
    _DRIVER.set(_POOLED)  # in the run's own task context (a copy): nothing else sees it
    return await flow.fn(ctx, value)


# How many runs sleep on the loop now (a short in-process wait of a run driven from it): stats() reports it.
_napping = 0


async def nap(seconds: float) -> None:
    """An in-process wait of a run driven from the loop: slept here, holding no thread and no connection."""
    global _napping
    _napping += 1  # only ever touched on the loop: no lock
    try:
        await _sleep(seconds)
    finally:
        _napping -= 1


_sleep = asyncio.sleep  # what nap awaits (a test holds sleepers at a gate by replacing it)


def _blocking(coro: Coroutine) -> Any:
    """From the drive thread (a step's function): run `coro` on the loop in this thread's context and wait."""
    return _submit(coro, contextvars.copy_context()).result()


def _advance(naps, value: Any = None, exc: BaseException | None = None) -> tuple[bool, Any]:
    """One segment of a generator of in-process waits (DurableContext.step_naps), in a pool thread, sent `value`
    or thrown `exc` (what the loop awaited for it): (False, what it yields next) or (True, its return value).
    A StopIteration cannot cross a future: it is unpacked here."""
    try:
        return False, (naps.throw(exc) if exc is not None else naps.send(value))
    except StopIteration as done:
        return True, done.value


async def _on_loop(coro: Coroutine, context: contextvars.Context) -> Any:
    """`coro` as a task of its own in `context` (the step's: ctx.cancelled() and heartbeat() find the step)."""
    return await asyncio.get_running_loop().create_task(coro, context=context)


def _driver() -> _Driver | _PooledDriver:
    driver = _DRIVER.get()
    if driver is None:
        raise RuntimeError("an async flow's context was used outside the run that owns it")
    return driver


async def _in_drive_thread(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return await _driver().call(fn, *args, **kwargs)


class AsyncDurableContext(DurableContext):
    """What an `async def` flow talks to: DurableContext's calls, awaitable. Each runs the sync call (the
    same records, the same replay) in the run's drive thread; a coroutine step's function runs on the loop."""

    def __init__(self, runner, state, default_retry):
        super().__init__(runner, state, default_retry)
        # The sync calls' own view of this context: one state (the same __dict__, so one position counter),
        # with the sync methods, so a sync call that makes another (set_event's step) stays sync.
        face = DurableContext.__new__(DurableContext)
        face.__dict__ = self.__dict__
        self._sync = face

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, retry=None, atomic: bool = False,
                   timeout: float | None = None, heartbeat_timeout: float | None = None) -> Any:
        coroutine = is_async(fn)
        if coroutine and atomic:
            raise InvalidInput(f"step {name!r}: atomic=True needs a sync function (its database effects commit with "
                               f"its record in the drive thread's transaction); got a coroutine function")
        driver = _driver()
        if not driver.releases:
            call = fn
            if coroutine:
                def call(*call_args: Any) -> Any:  # in the drive thread, inside interrupt.running: ctx.cancelled()
                    return _blocking(fn(*call_args))

            return await driver.call(self._sync.step, name, call, *args, retry=retry, atomic=atomic, timeout=timeout,
                                     heartbeat_timeout=heartbeat_timeout)
        # Driven from the loop: the step's records in the pool, a short retry backoff slept on the loop, a coroutine
        # function awaited on the loop (no pool thread held while it runs), a sync one called in the pool. Every
        # segment runs in ONE context of its own (`step_context`, entered by one thread at a time, then by the
        # coroutine's task): the running step interrupt.running sets in one segment is the one the coroutine
        # (ctx.cancelled(), heartbeat()) and the next segment (its reset) see.
        naps = self._sync.step_naps(name, fn, args, retry, atomic, timeout, heartbeat_timeout, awaits=coroutine)
        step_context = contextvars.copy_context()
        sent: tuple[Any, BaseException | None] = (None, None)
        while True:
            finished, value = await in_context(step_context, _advance, naps, *sent)
            if finished:
                return value
            if isinstance(value, Awaited):
                try:
                    sent = (await _on_loop(value.fn(*value.args), step_context), None)
                except BaseException as exc:  # a failed attempt: thrown back, the step's own code records it
                    sent = (None, exc)
                continue
            sent = (None, None)
            await nap(value)

    async def sleep(self, seconds: float) -> None:
        driver = _driver()
        if not driver.releases:
            return await driver.call(self._sync.sleep, seconds)
        await self._sleep_until(now() + timedelta(seconds=check_seconds(seconds, "sleep")))

    async def sleep_until(self, when) -> None:
        driver = _driver()
        if not driver.releases:
            return await driver.call(self._sync.sleep_until, when)
        await self._sleep_until(check_moment(when, "sleep_until"))

    async def _sleep_until(self, due) -> None:
        """DurableContext._sleep_until of a run driven from the loop: the records in the pool (the same ones),
        the in-process part slept on the loop."""
        pos, remaining = await _POOLED.call(self._sync._sleep_begin, due)
        if pos is None:
            return
        if remaining > 0:
            await nap(remaining)
        self._sync._end_wait(pos, "$sleep")  # queued for the next write (no I/O), as in the sync sleep

    async def recv(self, topic: str, timeout: float | None = None) -> Any:
        return await _in_drive_thread(self._sync.recv, topic, timeout)

    async def set_event(self, key: str, value: Any) -> None:
        return await _in_drive_thread(self._sync.set_event, key, value)

    async def start_child(self, flow: Any, input: Any, execution_id: str | None = None) -> AsyncChildHandle:
        handle = await _in_drive_thread(self._sync.start_child, flow, input, execution_id)
        return AsyncChildHandle(self, handle.execution_id)

    async def patched(self, patch_id: str) -> bool:
        return await _in_drive_thread(self._sync.patched, patch_id)

    async def deprecate_patch(self, patch_id: str) -> None:
        return await _in_drive_thread(self._sync.deprecate_patch, patch_id)

    async def continue_as_new(self, input: Any) -> None:
        self._sync.continue_as_new(input)  # raises ContinueAsNew (or InvalidInput): nothing to await

    async def heartbeat_async(self, details: Any = None) -> None:
        """ctx.heartbeat() for a coroutine step (the same call: it touches no database)."""
        self.heartbeat(details)


class AsyncChildHandle:
    """A child started by an async flow: `await handle.result()`."""

    __slots__ = ("_ctx", "execution_id")

    def __init__(self, ctx: AsyncDurableContext, execution_id: str):
        self._ctx, self.execution_id = ctx, execution_id

    async def result(self) -> Any:
        return await _in_drive_thread(self._ctx._sync._await_child, self.execution_id)

    def __repr__(self) -> str:
        return f"<AsyncChildHandle {self.execution_id}>"


# == awaitable faces for callers (async views) ===========================================================
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_pid: int | None = None


def pool_size() -> int:
    return conf.get("LOOM_ASYNC_DB_THREADS")


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool, _pool_pid
    with _loop_lock:
        if _pool is None or _pool_pid != os.getpid() or _pool._max_workers != pool_size():
            if _pool is not None and _pool_pid == os.getpid():
                _pool.shutdown(wait=False)  # a resized pool: the old one's threads end once their calls did
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=pool_size(), thread_name_prefix="loom-adb")
            _pool_pid = os.getpid()
        return _pool


_busy = 0  # pool threads in a call now (stats())
_busy_lock = threading.Lock()


def stats() -> dict[str, int]:
    """What the async side holds now: pool threads (alive, busy in a call) and runs sleeping on the loop."""
    alive = sum(1 for thread in threading.enumerate() if thread.name.startswith("loom-adb"))
    return {"pool_threads": alive, "pool_busy": _busy, "napping": _napping, "pool_size": pool_size()}


def _pooled(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn` as a request would run it: a pool thread keeps its Django connections between calls, so the stale
    ones are closed before and after (close_old_connections: CONN_MAX_AGE, CONN_HEALTH_CHECKS, a connection
    that errored), and after a failure that says the server could not be reached (a restart, a failover) every
    connection of the thread is closed: the next call on the thread connects afresh instead of failing on the
    dead session until the process restarts."""
    global _busy
    with _busy_lock:
        _busy += 1
    try:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if cannot_reach(exc):
                for conn in connections.all(initialized_only=True):
                    conn.close()
            raise
        finally:
            close_old_connections()
    finally:
        with _busy_lock:
            _busy -= 1


async def in_pool(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a thread of the bounded pool (in a copy of the caller's context), awaited."""
    return await in_context(contextvars.copy_context(), fn, *args, **kwargs)


async def in_context(context: contextvars.Context, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` in a thread of the bounded pool, in `context` (nobody else may be in it meanwhile)."""
    return await asyncio.get_running_loop().run_in_executor(
        _executor(), functools.partial(context.run, _pooled, fn, *args, **kwargs))


# == runs driven from the loop ============================================================================
def traced(adrive: Callable) -> Callable:
    """Wraps Runner.adrive as telemetry.traced_run wraps Runner._drive: the run counted and, with tracing on, its
    `loom.run` span (telemetry.run_span) around it, its steps' and waits' spans inside (on_event opens them in
    the pool threads, in copies of the run's task context: they see its span). The span's parent may need a read
    of the execution's first event (telemetry.run_parent): in the pool, never on the loop."""

    @functools.wraps(adrive)
    async def wrapper(runner, flow, value):
        if not telemetry.TRACING and not telemetry.METRICS:
            return await adrive(runner, flow, value)
        parent = await in_pool(telemetry.run_parent, runner) if telemetry.TRACING else None
        with telemetry.run_span(runner, flow, parent) as settled:
            return settled(await adrive(runner, flow, value))

    return wrapper


class _Slot:
    """Where Runner.drive leaves an async run for the awaitable face that called it (hand_back)."""

    __slots__ = ("taken",)

    def __init__(self):
        self.taken: tuple | None = None


_HAND_BACK: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("loom_aio_hand_back", default=None)
HANDED_BACK: Any = object()  # what Runner.drive returns for a run it handed back (only its face sees it)


def hand_back(runner, flow, value: Any) -> bool:
    """Runner.drive of an async flow inside astart/aresume's pool call: leave the run in the slot (with this
    thread's context: its shard binding) for the face (or a worker's loop lane: queues/loop.py) to drive from the
    loop; False anywhere else (a sync call's run, a worker's waker's or sweep's: driven in the calling thread)."""
    slot = _HAND_BACK.get()
    if slot is None or slot.taken is not None:
        return False
    context = contextvars.copy_context()
    context.run(_HAND_BACK.set, None)  # a start made inside the run (a sync step's) is the caller's own
    slot.taken = (runner, flow, value, context)
    return True


def _with_slot(slot: _Slot, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    token = _HAND_BACK.set(slot)
    try:
        return fn(*args, **kwargs)
    finally:
        _HAND_BACK.reset(token)


_live: set[asyncio.Task] = set()  # runs driven on the loop (a strong reference: the loop keeps only weak ones)


async def begin_driven(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, tuple | None]:
    """`fn` (start, resume, a worker's begin of a claimed queue entry: queues/service.py) in the pool, where an
    async run it begins is handed back instead of driven there: (its outcome, None), or (HANDED_BACK, the run)
    for `drive_handed`. Split from `_driven` so that a caller tells an error of the begin from one of the run."""
    slot = _Slot()
    outcome = await in_pool(_with_slot, slot, fn, *args, **kwargs)
    return outcome, (slot.taken if outcome is HANDED_BACK else None)


async def _driven(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn` (start, resume) in the pool; an async run it begins is driven on the process loop (Runner.adrive),
    holding a pool thread only during each journal call. A caller that stops awaiting (a client gone) leaves
    the run going on, as a caller's thread would."""
    outcome, taken = await begin_driven(fn, *args, **kwargs)
    return outcome if taken is None else await drive_handed(taken)


async def drive_handed(taken: tuple) -> Any:
    """Drive a run `begin_driven` handed back, on the process loop (Runner.adrive, as a task of its own in the
    context the begin left it: its shard binding), and await its outcome; shielded, so a caller that stops
    awaiting leaves the run going on."""
    runner, flow, value, context = taken
    target = loop()

    def begin() -> asyncio.Task:
        task = target.create_task(runner.adrive(flow, value), context=context)
        _live.add(task)
        task.add_done_callback(_live.discard)
        return task

    if asyncio.get_running_loop() is target:  # a face awaited by flow code itself
        return await asyncio.shield(begin())
    done: concurrent.futures.Future = concurrent.futures.Future()
    target.call_soon_threadsafe(lambda: begin().add_done_callback(lambda finished: _copy_outcome(finished, done)))
    return await asyncio.shield(asyncio.wrap_future(done))


async def astart(flow, input: Any, execution_id: str | None = None, meta: dict | None = None, **options: Any):
    """`start()`, awaitable. The start runs in a pool thread; an async flow's run then goes on from the loop,
    each journal call in a pool thread, its short in-process waits slept on the loop (no thread held); a sync
    flow's run stays in the pool thread until it settles or parks."""
    from journal.flows.runtime import start

    return await _driven(start, flow, input, execution_id, meta, **options)


async def aresume(execution_id: str, **options: Any):
    """`resume()`, awaitable, as astart: an async flow's run is driven from the loop."""
    from journal.flows.runtime import resume

    return await _driven(resume, execution_id, **options)


async def acancel(execution_id: str, reason: str = "cancelled"):
    from journal.flows.runtime import cancel

    return await in_pool(cancel, execution_id, reason)


async def asend(execution_id: str, topic: str, payload: Any, message_id: str | None = None) -> str:
    from journal.flows.waits import send

    return await in_pool(send, execution_id, topic, payload, message_id)


async def adescribe(execution_id: str, reader=None) -> dict:
    from journal.flows.describe import describe

    return await in_pool(describe, execution_id, reader)


async def aoutcome_of(execution_id: str):
    from journal.flows.runtime import outcome_of

    return await in_pool(outcome_of, execution_id)


class _LoopFlag:
    """A Waiter's `woken` that the listener thread sets, waking an asyncio.Event on its loop."""

    __slots__ = ("at", "event", "loop")

    def __init__(self, running: asyncio.AbstractEventLoop):
        self.loop, self.event, self.at = running, asyncio.Event(), 0.0

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._wake, time.monotonic())

    def _wake(self, at: float) -> None:
        self.at = at  # when the notification came: a read begun after it sees what it announced
        self.event.set()


async def aget_event(execution_id: str, key: str, timeout: float | None = None, default: Any = None) -> Any:
    """`get_event()`, awaitable, holding no thread while it waits: each read runs in the pool; between reads
    the caller sleeps on its loop until the shared LISTEN session (PostgreSQL) wakes it or LOOM_WAIT_POLL
    passes (the only wake-up on SQLite, and while the session is down)."""
    from journal.flows import event_listener, waits

    wait = 0.0 if timeout is None else waits.check_seconds(timeout, "get_event timeout")
    until = time.monotonic() + wait
    found, value, target, alias = await in_pool(_first_read, execution_id, key)
    if found:
        return value
    if wait <= 0:
        return default
    waiter = None
    if alias is not None:
        waiter = event_listener.listener_for(alias).waiter(target)
        flag = _LoopFlag(asyncio.get_running_loop())
        waiter.woken = flag  # the listener calls woken.set(): it wakes this coroutine, no thread waits
    since = time.monotonic()  # subscribed (and about to read) from here: a read begun later is one of ours
    try:
        while True:
            if waiter is not None:
                waiter.follow(target)
            found, value, target, moved = await _shared_read(execution_id, target, key, since)
            if moved:
                continue
            if found:
                return value
            left = until - time.monotonic()
            if left <= 0:
                return default
            # While the LISTEN session is up it wakes every waiter on a notification and after each reconnect, so
            # a waiter sleeps until then (or its timeout); polls (LOOM_WAIT_POLL) only while it is down and on
            # SQLite: 1,000 waiters polling each second would be 1,000 reads a second through the pool.
            listening = waiter is not None and waiter.listener.connected
            pause = left if listening else min(left, conf.get("LOOM_WAIT_POLL"))
            since = time.monotonic()  # a poll: any read begun after the pause began will do
            if waiter is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(flag.event.wait(), pause)
                if flag.event.is_set():
                    since = max(since, flag.at)  # woken: only a read begun after the notification came
                flag.event.clear()
    finally:
        if waiter is not None:
            waiter.close()


# Reads in flight, shared by the waiters of one (loop, execution, run, key): 1,000 callers woken by one
# notification make a few reads, not 1,000 through the pool. A waiter joins whatever read is in flight; a value
# it finds is the value (set once, never unset); a miss counts only from a read begun after the waiter's
# `since` (its subscription, its wake-up): one begun earlier may have read before the commit, so it reads again.
_inflight: dict[tuple, tuple[float, asyncio.Future]] = {}


async def _shared_read(execution_id: str, target: str, key: str, since: float) -> tuple[bool, Any, str, bool]:
    slot = (id(asyncio.get_running_loop()), execution_id, target, key)
    while True:
        found = _inflight.get(slot)
        if found is None or found[1].done():
            began = time.monotonic()
            future = asyncio.ensure_future(in_pool(_read, execution_id, target, key))
            _inflight[slot] = found = (began, future)
            future.add_done_callback(lambda done: _inflight.pop(slot, None)
                                     if _inflight.get(slot, (0, None))[1] is done else None)
        answer = await asyncio.shield(found[1])
        if answer[0] or answer[3] or found[0] >= since:
            return answer


def _first_read(execution_id: str, key: str) -> tuple[bool, Any, str, str | None]:
    """get_event's checks and first read, on the execution's shard: (found, value, the run to follow, the alias
    whose LISTEN session notifies its set_event, or None where none does: SQLite)."""
    from journal import shards
    from journal.flows import waits, writer
    from journal.flows.errors import UnknownExecution
    from journal.ids import check_stored_id

    waits.check_name(key, "event key")
    try:
        check_stored_id(execution_id, "execution id")
    except Exception as exc:
        raise InvalidInput(str(exc)) from None
    with shards.on_stream(execution_id):
        header = writer.header_status(execution_id)
        if header is None:
            raise UnknownExecution(execution_id)
        target = waits._current_run(execution_id, header)
        found, value = waits._store(target).flow_event(target, key)
        return found, value, target, waits._alias() if waits._store().wait_notifications else None


def _read(execution_id: str, target: str, key: str) -> tuple[bool, Any, str, bool]:
    """One more read: (found, value, the run that stands for the execution now, whether that moved)."""
    from journal import shards
    from journal.flows import waits

    with shards.on_stream(execution_id):
        current = waits._current_run(target)
        if current != target:
            return False, None, current, True
        found, value = waits._store(target).flow_event(target, key)
        return found, value, target, False
