"""The framed servers running in this process, by socket path: the in-process path.

:mod:`.framed_server` registers a server here when it starts and :mod:`.framed_client`
looks it up before each call; a call to a server found here skips the socket.
The registry is a module of its own so that neither half imports the other.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

from courier import wire
from courier.transport import _base


class ServerHere(Protocol):
    """What a client calls on a server of its own process."""

    def check_token_here(self, token: Optional[str], method: str, address: str) -> None:
        """Raises errors.PermissionDeniedError unless the server accepts ``token``."""

    def method_names(self) -> List[str]:
        """Returns the names of the methods bound on the server."""

    def call_here(self, token: Optional[str], method: str, pickle: bytes,
                  buffers: Sequence[memoryview], timeout: Optional[float],
                  address: str) -> wire.Response:
        """Runs a call on a worker thread and waits for its response."""

    def call_here_async(self, future: _base.CallFuture, token: Optional[str], method: str,
                        pickle: bytes, buffers: Sequence[memoryview], address: str,
                        finish: Callable[[wire.Response], Any]) -> None:
        """Starts a call; ``future`` gets ``finish(response)``."""


# Read as ``_here.servers`` at each use, so that a test may replace the dict.
servers: Dict[str, ServerHere] = {}


def _forget_servers() -> None:
    servers.clear()  # A forked child has none of its parent's server threads.


os.register_at_fork(after_in_child=_forget_servers)
