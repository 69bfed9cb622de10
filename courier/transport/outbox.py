"""Frames that several threads send on one socket (a futures connection's), in few system calls."""

from __future__ import annotations

import collections
import socket
import threading
from typing import Any, List, Optional

from courier.transport import frames


class Outbox:
    """Frames that several threads send on one socket.

    A thread that finds the socket busy leaves its frame here; the thread sending
    sends it too, so frames from many threads go out in few system calls and no
    thread ever waits for another's send.
    """

    def __init__(self, sock: Optional[socket.socket] = None):
        self.sock = sock  # None while connecting: frames wait here.
        self.skip: set = set()  # Call ids whose CALL frames must not go out (cancelled).
        self._frames: collections.deque = collections.deque()
        self._lock = threading.Lock()

    def put(self, call_id: int, parts: List[Any]) -> None:
        """Sends a frame, now or with the frames of the thread sending.

        Raises:
          OSError: sending failed; this frame and others queued are lost.
        """
        self._frames.append((call_id, parts))
        self.flush()

    def flush(self) -> None:
        queued = self._frames
        while queued and self.sock is not None:
            if not self._lock.acquire(False):
                return  # The sending thread re-checks after it is done.
            try:
                if len(queued) == 1 and not self.skip:
                    frames.send(self.sock, queued.popleft()[1])
                else:
                    self._write([queued.popleft() for _ in range(len(queued))])
            finally:
                self._lock.release()

    def clear(self) -> None:
        self._frames.clear()

    def _write(self, batch: List[tuple]) -> None:
        sock = self.sock
        joined: List[Any] = []
        skip = self.skip
        for call_id, parts in batch:
            if skip and call_id in skip:
                skip.discard(call_id)
                continue
            if len(parts) == 1:
                joined.append(parts[0])
                continue
            if joined:
                frames.send(sock, [b''.join(joined)])
                joined = []
            frames.send(sock, parts)
        if joined:
            frames.send(sock, [joined[0] if len(joined) == 1 else b''.join(joined)])
