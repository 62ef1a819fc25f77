"""The size of a request's head (request line and header fields), counted as its bytes arrive.

h11, uvicorn's HTTP/1.1 parser, limits only a head still incomplete to its
max_incomplete_event_size (16 KiB, h11/_connection.py): a larger head that arrives in one read
is parsed and served, and one refused part-way is answered 400 and closed with its rest
unread, which the kernel turns into a reset the client may see instead of the answer. Counting
here, before h11 sees the bytes, refuses every head over the limit the same way whatever the
reads: 414 when the request line alone is over it, 431 when the header fields take it over (Go's
net/http answers 431 past its MaxHeaderBytes, which counts the request line too).
"""

from __future__ import annotations

import re

HEAD_LIMIT = 16 * 1024
URI_TOO_LONG = 414
HEADER_FIELDS_TOO_LARGE = 431
# The blank line that ends a head, as h11 finds it (h11/_receivebuffer.py).
_BLANK_LINE = re.compile(rb"\n\r?\n")


class RequestHead:
    """One connection's current request head. `feed` the bytes that arrive while no request is
    in flight; after a head's end, the next `feed` starts the next head."""

    def __init__(self, limit: int = HEAD_LIMIT) -> None:
        self.limit = limit
        self._restart()

    def _restart(self) -> None:
        self.size = 0  # bytes of this head seen so far
        self.line_ended = False
        self.complete = False
        self._tail = b""  # the last bytes seen: a blank line may straddle two reads

    def feed(self, data: bytes) -> int | None:
        """414 or 431 once the head is over the limit; None while it is within it."""
        if self.complete:
            self._restart()
        if not self.line_ended:
            end = data.find(b"\n")
            if end < 0 and self.size + len(data) > self.limit:
                return URI_TOO_LONG
            if end >= 0:
                if self.size + end > self.limit:
                    return URI_TOO_LONG
                self.line_ended = True
        window = self._tail + data
        blank = _BLANK_LINE.search(window)
        if blank is not None:
            self.complete = True
            head_size = self.size - len(self._tail) + blank.end()
            return HEADER_FIELDS_TOO_LARGE if head_size > self.limit else None
        self.size += len(data)
        self._tail = window[-2:]
        return HEADER_FIELDS_TOO_LARGE if self.size > self.limit else None
