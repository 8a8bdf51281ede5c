"""The API's gunicorn worker: a gthread worker that a slow client cannot starve, and that can retire itself.

gunicorn's gthread worker hands a connection to a request thread as soon as its first byte arrives;
the thread then blocks reading the rest of the request. Two clients that send half a request and
stall hold two threads for as long as they like (gunicorn's --timeout does not apply: the worker's
main loop keeps heartbeating), and every other request queues behind them.

``BufferingWorker` reads in its main loop instead, without blocking, the way a buffering reverse proxy
does: a connection reaches a request thread only once its whole request is buffered (the head and a
body of known length, or every chunk of a chunked body), so a thread never waits on a client. A
request that is not complete within `read_timeout` seconds of its first wait is answered
`408 Request Timeout` and closed.

What is buffered is bounded as a whole (loomapi/framing.py frames each read as it arrives, in linear
time): a declared body larger than LOOM_API_MAX_BODY_BYTES is not buffered, the request goes to a
thread on its head alone and is refused `413` on its declared length; a chunked body whose data or
framing (size lines, extensions, trailer) passes its bound is answered `413` (malformed framing `400`)
by the main loop, and the connection closed. A request to the API with a body but no accepted token
goes to a thread on its head alone too, so its body is never buffered: the view answers `401`. The
views answer `Connection: close` when they answer without reading a body (see
`close_header_wrapper`).

Retiring: a request thread that sees a call stuck past its timeout (loomapi/calls.py) calls
`retire_current_worker()`. The worker stops accepting, finishes its other requests within the
graceful timeout and exits; the arbiter starts a fresh worker in its place. The stuck thread
cannot be interrupted (Python threads cannot be killed), so a watchdog ends the process hard once
the graceful timeout has passed.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import selectors
import threading
import time
from collections import deque
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

from journal import conf
from loomapi.auth import TokenConfigError, token_entries
from loomapi.framing import RequestFramer, Verdict

logger = logging.getLogger("loomapi.server")

READ_TIMEOUT = 10.0
"""Seconds a client gets to send a whole request (loom_serve_api --read-timeout sets it before the fork)."""

READ_STEPS = 16
"""Reads (of up to 64 KiB) from one connection per turn of the main loop."""

_current: BufferingWorker | None = None


def retire_current_worker(reason: str) -> bool:
    """Make this process's worker stop after its in-flight requests (the arbiter replaces it).

    False when this process is not a BufferingWorker (the Django test client, runserver).
    """
    worker = _current
    if worker is None:
        logger.error("a worker should retire (%s) but this process is not a loomapi server worker", reason)
        return False
    worker.retire(reason)
    return True


def body_limit() -> int:
    return conf.get("LOOM_API_MAX_BODY_BYTES")


def complete(buffer: bytes | bytearray, limit: int) -> bool:
    """True when `buffer` holds a whole request head and its body, or as much as a thread should wait for.

    Also True for what is refused anyway (a head over MAX_HEAD_BYTES, a malformed length or chunk
    size, a declared body over `limit`, framing over its bounds): it is answered at once.
    """
    return RequestFramer(limit).advance(buffer) is not Verdict.MORE


def _expects_continue(framer: RequestFramer) -> bool:
    return (framer.header(b"expect") or b"").lower() == b"100-continue"


def refused_before_its_body(framer: RequestFramer) -> bool:
    """True when a request with a body would be refused 401 by the API: it goes to a thread on its head.

    The body of a caller with no valid token is never buffered (a stalled or slow body would hold
    the worker's memory for the read timeout on behalf of nobody). The view answers 401 with
    `Connection: close` without reading the body. /api/health needs no token; paths outside /api/
    (the admin's forms) are buffered as before.
    """

    if not framer.has_body or not conf.get("LOOM_API_AUTH"):
        return False
    path = framer.path()
    if not path.startswith("/api/") or path == "/api/health":
        return False
    return not _token_accepted(framer.header(b"authorization") or b"")


def _token_accepted(header: bytes) -> bool:
    """The head's bearer token is one of LOOM_API_TOKENS (compared in constant time, like the view does)."""

    scheme, _, token = header.partition(b" ")
    offered = token.strip()
    if scheme.lower() != b"bearer" or not offered:
        return False
    try:
        entries = token_entries()
    except TokenConfigError:
        return False  # the view answers this configuration error itself
    found = False
    for entry in entries:
        found = hmac.compare_digest(offered, entry.token) or found
    return found


class BufferingWorker(ThreadWorker):
    """gthread, with requests buffered by the main loop before a thread sees them (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reading_conns: deque = deque()
        self.retiring = False

    def init_process(self) -> None:
        global _current
        _current = self
        super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        self.wsgi = close_header_wrapper(self.wsgi)

    # -- buffering -----------------------------------------------------------------------------------
    def enqueue_req(self, conn) -> None:
        """Every path to a request thread goes through here: a new connection, a kept-alive one that
        became readable, a deferred one, and pipelined bytes after a response."""
        if getattr(conn, "loom_ready", False):
            conn.loom_ready = False
            super().enqueue_req(conn)
            return
        buffered = b""
        if conn.parser is not None:
            buffered = conn.parser.unreader.take_buffered()
        conn.loom_buffer = bytearray(buffered)
        conn.loom_framer = RequestFramer(body_limit())
        conn.loom_deadline = time.monotonic() + READ_TIMEOUT
        conn.loom_continued = False
        if buffered and self._act(conn, conn.loom_framer.advance(conn.loom_buffer)):
            return
        conn.sock.setblocking(False)
        self.reading_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn, client) -> None:
        """Read what the client sent (without blocking), framing it read by read; act once it is whole
        or refused. At most READ_STEPS reads per turn, so one fast client cannot hold the main loop."""
        closed = False
        verdict = Verdict.MORE
        try:
            for _ in range(READ_STEPS):
                data = conn.sock.recv(65536)
                if not data:
                    closed = True
                    break
                conn.loom_buffer += data
                verdict = conn.loom_framer.advance(conn.loom_buffer)
                if verdict is not Verdict.MORE or len(data) < 65536:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            closed = True
        if closed:
            self._drop(conn)
            return
        if self._act(conn, verdict, reading=True):
            return
        if not conn.loom_continued and _expects_continue(conn.loom_framer):
            # The client waits for "100 Continue" before it sends the body (curl does, for larger
            # bodies): say it now, or it would wait its own timeout first. (gunicorn may send one
            # more when it builds the request; a client ignores extra 1xx responses, RFC 9110 15.2.)
            conn.loom_continued = True
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _act(self, conn, verdict: Verdict, reading: bool = False) -> bool:
        """Hand the request over or refuse it for `verdict`; True when it is no longer being read."""
        framer = conn.loom_framer
        if verdict is Verdict.MORE and framer.head_done and refused_before_its_body(framer):
            verdict = Verdict.PARSER  # the view answers 401 from the head alone
        if verdict is Verdict.MORE:
            return False
        if verdict in (Verdict.TOO_LARGE, Verdict.MALFORMED):
            logger.info("refusing a request from %s: %s", conn.client, framer.problem)
            self._drop(conn, _refusal(verdict, framer.problem))
            return True
        if reading:
            self._stop_reading(conn)
        self._hand_over(conn)
        return True

    def _hand_over(self, conn) -> None:
        if conn.parser is None:
            conn.init()  # builds the parser (plain HTTP/1.1: no TLS here, a proxy terminates it)
        conn.parser.unreader.unread(bytes(conn.loom_buffer))
        conn.loom_buffer = bytearray()
        conn.data_ready = True
        conn.loom_ready = True
        self.enqueue_req(conn)

    def _stop_reading(self, conn) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        with contextlib.suppress(ValueError):
            self.reading_conns.remove(conn)

    def _drop(self, conn, answer: bytes = b"") -> None:
        self._stop_reading(conn)
        if answer:
            with contextlib.suppress(OSError):  # best effort, non-blocking: a stalled client may not read it
                conn.sock.setblocking(False)
                conn.sock.send(answer)
        self.nr_conns -= 1
        conn.close()

    def murder_pending(self) -> None:
        """gunicorn's pending-connection timeout, plus ours: requests not whole within the read timeout."""
        super().murder_pending()
        now = time.monotonic()
        expired = [conn for conn in self.reading_conns if conn.loom_deadline <= now]
        for conn in expired:
            logger.info("closing a connection from %s: no whole request within %.0f s", conn.client, READ_TIMEOUT)
            self._drop(conn, _REQUEST_TIMEOUT if conn.loom_buffer else b"")

    # -- retiring ------------------------------------------------------------------------------------
    def run(self) -> None:
        super().run()
        if self.retiring:
            # The stuck call's thread would hold a normal exit (the interpreter joins its threads): the
            # connections are closed, so exit now and let the arbiter start the replacement at once.
            logger.info("worker %s retired: exiting", os.getpid())
            logging.shutdown()
            os._exit(0)

    def retire(self, reason: str) -> None:
        if self.retiring:
            return
        self.retiring = True
        logger.error("worker %s retires: %s; the arbiter starts a replacement", os.getpid(), reason)
        self.alive = False
        self.method_queue.defer(lambda: None)  # wake the main loop so that it starts stopping
        grace = float(self.cfg.graceful_timeout) + 1.0
        threading.Thread(target=_exit_after, args=(grace,), name="loomapi-retire", daemon=True).start()


def _refusal(verdict: Verdict, problem: str) -> bytes:
    """The whole response to a request refused by the main loop (it then closes the connection)."""
    if verdict is Verdict.TOO_LARGE:
        status, code = b"413 Content Too Large", "payload_too_large"
    else:
        status, code = b"400 Bad Request", "bad_request"
    body = json.dumps({"error": {"code": code, "message": f"request refused: {problem}", "id": None}}).encode()
    return (b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(body), body))


_TIMEOUT_BODY = b'{"error": {"code": "request_timeout", "message": "the request was not sent in time", "id": null}}'
_REQUEST_TIMEOUT = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY))


def _exit_after(grace: float) -> None:
    """A retiring worker whose stuck thread keeps it alive is ended here, after the graceful timeout."""
    time.sleep(grace)
    logger.error("worker %s still alive %.0f s after retiring: exiting hard", os.getpid(), grace)
    os._exit(1)


def close_header_wrapper(app):
    """A WSGI wrapper: a response with `Connection: close` makes gunicorn close the connection.

    gunicorn drops hop-by-hop headers set by the application and would announce keep-alive; the
    API says close when it answered without reading a request body (a 401/413/415 to a large
    upload), so the client is not told to reuse a connection the server is about to drop.
    """

    def wrapped(environ, start_response):
        def start(status, headers, exc_info=None):
            if any(name.lower() == "connection" and value.lower() == "close" for name, value in headers):
                responder = getattr(start_response, "__self__", None)
                if responder is not None and hasattr(responder, "force_close"):
                    responder.force_close()
            return start_response(status, headers, exc_info)

        return app(environ, start)

    return wrapped

