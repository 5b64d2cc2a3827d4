"""Socket reads with an idle timeout *and* a deadline, for the weight server and its client.

A socket timeout bounds one read, so a peer that drips one byte at a time is never timed out.
:class:`DeadlineReader` is the raw stream under ``http.server``'s and ``http.client``'s
``BufferedReader``: before every read it sets the timeout to what is left until ``deadline``
(at most ``idle``), and past the deadline raises :class:`TimeoutError`."""

from __future__ import annotations

import io
import socket
import time


class DeadlineReader(io.RawIOBase):
    """Reads ``sock``: each read waits at most ``idle`` seconds, and none starts after
    ``deadline`` (a :func:`time.monotonic` time; None: no deadline; settable between reads).

    ``keep``: a stream to close with this one — the ``sock.makefile()`` that this reader
    replaces, whose reference keeps the socket open after its connection object lets go of it
    (as ``http.client`` does once the response head is read)."""

    def __init__(self, sock: socket.socket, idle: float | None, deadline: float | None = None,
                 *, keep: io.IOBase | None = None) -> None:
        super().__init__()
        self.sock = sock
        self.idle = idle
        self.deadline = deadline
        self._keep = keep
        #: a read ran out of time (its idle timeout or the deadline); the caller may reset it
        self.timed_out = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        wait = self.idle
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                raise TimeoutError("deadline passed")
            wait = left if wait is None else min(wait, left)
        self.sock.settimeout(wait)
        try:
            return self.sock.recv_into(b)
        except TimeoutError:
            self.timed_out = True
            raise

    def close(self) -> None:
        if self._keep is not None:
            self._keep.close()
            self._keep = None
        super().close()
