"""Where a request ends on the wire: the buffering worker's incremental view of a request being received.

The worker (loomapi/worker.py) buffers a request in its main loop until it is whole, then hands it to a
request thread, where gunicorn parses it again. What it buffers must be bounded as a whole, not only the
body's data: a client could otherwise send chunk-size lines, chunk extensions or trailer fields without
end (all framing, none of it counted as body). So everything after the head is bounded by
LOOM_API_MAX_BODY_BYTES plus `FRAMING_BYTES`, a chunk-size line (with its extensions) by
`MAX_CHUNK_LINE_BYTES` and the trailer section by `MAX_TRAILER_BYTES`; the head by `MAX_HEAD_BYTES`.

Each `advance` resumes where the last one stopped, so the work to frame a request is linear in its size
however it is split across reads (a re-walk of every chunk on each read was quadratic in the number of
chunks).
"""

from __future__ import annotations

import enum
from urllib.parse import unquote, urlsplit

MAX_HEAD_BYTES = 64 * 1024
"""A head longer than this goes to a thread as it is: gunicorn's parser refuses it (400)."""

MAX_CHUNK_LINE_BYTES = 8190
"""A chunk-size line (size and extensions) longer than this is refused (gunicorn's own default bound)."""

MAX_TRAILER_BYTES = 32 * 1024
"""The trailer section (the fields after the last chunk) longer than this is refused."""

FRAMING_BYTES = 64 * 1024
"""What a chunked body may carry on the wire beyond its data: size lines, extensions, CRLFs, trailer."""

_HEX = frozenset(b"0123456789abcdefABCDEF")


class Verdict(enum.Enum):
    MORE = "more"                # not whole yet: keep reading
    WHOLE = "whole"              # the head and the whole body are buffered: hand it to a thread
    PARSER = "parser"            # gunicorn's parser (or the view) answers it from what is buffered
    TOO_LARGE = "too_large"      # 413 and close, from the main loop
    MALFORMED = "malformed"      # 400 and close, from the main loop


class RequestFramer:
    """Follows one request through a growing buffer; `advance(buffer)` after each read."""

    def __init__(self, body_limit: int):
        self.body_limit = body_limit
        self.state = "head"
        self.pos = 0  # where the next scan starts
        self.body_start = 0
        self.length = 0  # Content-Length, or what is left of the current chunk's data
        self.trailer_start = 0
        self.scan = 0  # where the search for a size or trailer line's end resumes
        self.problem = ""
        self.head_lines: list[bytes] = []

    # -- what the head said ------------------------------------------------------------------------
    @property
    def head_done(self) -> bool:
        return self.state != "head"

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower case), None when absent."""
        for line in self.head_lines[1:]:
            field, sep, value = line.partition(b":")
            if sep and field.strip().lower() == name:
                return value.strip()
        return None

    def path(self) -> str:
        """The request target's path, percent-decoded (what Django resolves), '' when unreadable."""
        parts = self.head_lines[0].split(b" ") if self.head_lines else []
        if len(parts) != 3:
            return ""
        try:
            return unquote(urlsplit(parts[1].decode("latin-1")).path)
        except ValueError:
            return ""

    @property
    def has_body(self) -> bool:
        return self.state not in ("head", "done") or self.length > 0

    # -- framing -----------------------------------------------------------------------------------
    def advance(self, buffer: bytes | bytearray) -> Verdict:
        if self.state == "head":
            verdict = self._head(buffer)
            if verdict is not None:
                return verdict
        if self.state == "length":
            return Verdict.WHOLE if len(buffer) - self.body_start >= self.length else Verdict.MORE
        verdict = self._chunks(buffer)
        if verdict is Verdict.MORE and len(buffer) - self.body_start > self.body_limit + FRAMING_BYTES:
            return self._refuse(Verdict.TOO_LARGE, "the chunked body's framing and data exceed "
                                f"LOOM_API_MAX_BODY_BYTES={self.body_limit} + {FRAMING_BYTES} bytes")
        return verdict

    def _head(self, buffer: bytes | bytearray) -> Verdict | None:
        end = buffer.find(b"\r\n\r\n", max(0, self.pos - 3))
        if end < 0:
            self.pos = len(buffer)
            return Verdict.PARSER if len(buffer) > MAX_HEAD_BYTES else Verdict.MORE
        if end > MAX_HEAD_BYTES:
            return Verdict.PARSER
        self.head_lines = bytes(buffer[:end]).split(b"\r\n")
        self.body_start = self.pos = end + 4
        encoding = self.header(b"transfer-encoding")
        if encoding is not None and b"chunked" in encoding.lower():
            self.state = "size"
            return None
        declared = self.header(b"content-length")
        if declared is None:
            self.state = "done"
            return Verdict.WHOLE
        if not declared.isdigit():
            self.state = "done"
            return Verdict.PARSER  # malformed: gunicorn says 400
        self.length = int(declared)
        self.state = "length"
        if self.length > self.body_limit:
            return Verdict.PARSER  # the view refuses it on its declared length (413); no byte is waited for
        return None

    def _chunks(self, buffer: bytes | bytearray) -> Verdict:
        while True:
            if self.state == "size":
                line_end = buffer.find(b"\r\n", max(self.pos, self.scan))
                if line_end < 0:
                    self.scan = max(self.pos, len(buffer) - 1)
                    if len(buffer) - self.pos > MAX_CHUNK_LINE_BYTES:
                        return self._refuse(Verdict.MALFORMED, f"a chunk-size line over {MAX_CHUNK_LINE_BYTES} bytes")
                    return Verdict.MORE
                if line_end - self.pos > MAX_CHUNK_LINE_BYTES:
                    return self._refuse(Verdict.MALFORMED, f"a chunk-size line over {MAX_CHUNK_LINE_BYTES} bytes")
                size_text = bytes(buffer[self.pos:line_end]).split(b";", 1)[0].rstrip(b" \t")
                if not size_text or not _HEX.issuperset(size_text):
                    return self._refuse(Verdict.MALFORMED, f"chunk size {size_text[:20]!r} is not hexadecimal")
                self.length = int(size_text, 16)
                self.pos = line_end + 2
                if self.length == 0:
                    self.state = "trailer"
                    self.trailer_start = self.scan = self.pos
                    continue
                if self.length > self.body_limit:
                    return self._refuse(Verdict.TOO_LARGE, f"a chunk of {self.length} bytes exceeds "
                                        f"LOOM_API_MAX_BODY_BYTES={self.body_limit}")
                self.state = "data"
            if self.state == "data":
                if len(buffer) < self.pos + self.length + 2:
                    return Verdict.MORE
                if buffer[self.pos + self.length:self.pos + self.length + 2] != b"\r\n":
                    return self._refuse(Verdict.MALFORMED, "chunk data is not followed by CRLF")
                self.pos += self.length + 2
                self.length = 0
                self.state = "size"
                continue
            # trailer: field lines, then an empty line; `pos` is where the current line starts
            line_end = buffer.find(b"\r\n", self.scan)
            if line_end < 0:
                self.scan = max(self.pos, len(buffer) - 1)  # a CR at the end may start the CRLF
                if len(buffer) - self.trailer_start > MAX_TRAILER_BYTES:
                    return self._refuse(Verdict.TOO_LARGE, f"the trailer section exceeds {MAX_TRAILER_BYTES} bytes")
                return Verdict.MORE
            if line_end + 2 - self.trailer_start > MAX_TRAILER_BYTES:
                return self._refuse(Verdict.TOO_LARGE, f"the trailer section exceeds {MAX_TRAILER_BYTES} bytes")
            if line_end == self.pos:
                self.state = "done"
                return Verdict.WHOLE
            self.pos = self.scan = line_end + 2

    def _refuse(self, verdict: Verdict, problem: str) -> Verdict:
        self.state = "done"
        self.problem = problem
        return verdict
