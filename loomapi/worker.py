"""The API's gunicorn worker: a gthread worker that a slow client cannot starve, and that can retire itself.

gunicorn's gthread worker hands a connection to a request thread as soon as its first byte arrives;
the thread then blocks reading the rest of the request. Two clients that send half a request and
stall hold two threads for as long as they like (gunicorn's --timeout does not apply: the worker's
main loop keeps heartbeating), and every other request queues behind them.

`BufferingWorker` reads in its main loop instead, without blocking, the way a buffering reverse proxy
does: a connection reaches a request thread only once its whole request is buffered (the head and a
body of known length, or every chunk of a chunked body), so a thread never waits on a client. A
request that is not complete within `read_timeout` seconds of its first wait is answered
`408 Request Timeout` and closed. A body larger than LOOM_API_MAX_BODY_BYTES is not buffered: the
request goes to a thread on its head alone, is refused `413` on its declared length and the
connection is closed (the view answers `Connection: close`, see `close_header_wrapper`).

Retiring: a request thread that sees a call stuck past its timeout (loomapi/calls.py) calls
`retire_current_worker()`. The worker stops accepting, finishes its other requests within the
graceful timeout and exits; the arbiter starts a fresh worker in its place. The stuck thread
cannot be interrupted (Python threads cannot be killed), so a watchdog ends the process hard once
the graceful timeout has passed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import threading
import time
from collections import deque
from functools import partial

from gunicorn.workers.gthread import ThreadWorker

logger = logging.getLogger("loomapi.server")

READ_TIMEOUT = 10.0
"""Seconds a client gets to send a whole request (serve_api --read-timeout sets it before the fork)."""

MAX_HEAD_BYTES = 64 * 1024
"""A head longer than this goes to a thread as it is: gunicorn's parser refuses it (400)."""

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
    from journal import conf

    return conf.get("LOOM_API_MAX_BODY_BYTES")


def complete(buffer: bytes | bytearray, limit: int) -> bool:
    """True when `buffer` holds a whole request head and its body, or as much as a thread should wait for.

    Also True for what the parser will refuse anyway (a head over MAX_HEAD_BYTES, a malformed
    length or chunk size, a declared body over `limit`): the thread answers it at once.
    """
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return len(buffer) > MAX_HEAD_BYTES
    body_start = end + 4
    length, chunked = 0, False
    for line in bytes(buffer[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            if not value.strip().isdigit():
                return True
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        return _chunks_complete(buffer, body_start, limit)
    if length > limit:
        return True  # refused on its declared length; the rest is not waited for
    return len(buffer) - body_start >= length


def _expects_continue(buffer: bytes | bytearray) -> bool:
    end = buffer.find(b"\r\n\r\n")
    return end >= 0 and b"\r\nexpect: 100-continue" in bytes(buffer[:end]).lower()


def _chunks_complete(buffer: bytes | bytearray, pos: int, limit: int) -> bool:
    """Walk the chunked body from `pos`: True at its last chunk and trailers, or past `limit` bytes."""
    total = 0
    while True:
        line_end = buffer.find(b"\r\n", pos)
        if line_end < 0:
            return len(buffer) - pos > 1024  # a chunk-size line this long is malformed: let the parser say so
        size_text = bytes(buffer[pos:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return True
        if size == 0:
            # Trailer fields, then an empty line.
            return buffer.find(b"\r\n\r\n", line_end) >= 0 or buffer[line_end:line_end + 4] == b"\r\n\r\n"
        total += size
        if total > limit:
            return True
        pos = line_end + 2 + size + 2
        if pos > len(buffer):
            return False


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
        conn.loom_deadline = time.monotonic() + READ_TIMEOUT
        if buffered and complete(conn.loom_buffer, body_limit()):
            self._hand_over(conn)
            return
        conn.sock.setblocking(False)
        self.reading_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))

    def _on_readable(self, conn, client) -> None:
        """Read what the client sent (without blocking); hand the request over once it is whole."""
        closed = False
        try:
            while True:
                data = conn.sock.recv(65536)
                if not data:
                    closed = True
                    break
                conn.loom_buffer += data
                if len(data) < 65536:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            closed = True
        if closed:
            self._drop(conn)
            return
        if complete(conn.loom_buffer, body_limit()):
            self._stop_reading(conn)
            self._hand_over(conn)
        elif not getattr(conn, "loom_continued", False) and _expects_continue(conn.loom_buffer):
            # The client waits for "100 Continue" before it sends the body (curl does, for larger
            # bodies): say it now, or it would wait its own timeout first. (gunicorn may send one
            # more when it builds the request; a client ignores extra 1xx responses, RFC 9110 15.2.)
            conn.loom_continued = True
            with contextlib.suppress(OSError):
                conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")

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

