"""The exceptions courier raises, one class per way a call can fail.

Each class also derives from the built-in exception a Python programmer would
expect for that failure (``TimeoutError``, ``ConnectionError``, ...), so code
that catches built-in exceptions keeps working when a call becomes remote.
"""

from __future__ import annotations


class CourierError(Exception):
    """Base class of every error courier raises itself."""


class RemoteError(CourierError):
    """The remote method raised an exception that cannot be re-raised locally.

    Raised when the remote exception could not be pickled by the server or
    unpickled by the client (for example its class exists only on the server).

    Attributes:
        remote_type: Qualified name of the remote exception's class.
        remote_traceback: The formatted traceback from the server.
    """

    def __init__(self, message: str, remote_type: str = '',
                 remote_traceback: str = ''):
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return type(self), (self.args[0], self.remote_type, self.remote_traceback)

    def __str__(self) -> str:
        message = self.args[0]
        if self.remote_traceback:
            message += '\n\nRemote traceback:\n' + self.remote_traceback.rstrip()
        return message


class RemoteTraceback(Exception):
    """Carries a server-side traceback as the ``__cause__`` of a re-raised error.

    Printing the re-raised exception then shows where it happened remotely.
    """

    def __str__(self) -> str:
        return '\n\n' + self.args[0].rstrip()


class CallTimeoutError(CourierError, TimeoutError):
    """A call did not complete within its ``call_timeout``."""


class ServerUnavailableError(CourierError, ConnectionError):
    """The server could not be reached, or went away during the call.

    Attributes:
      unsent: True when the call is known not to have gone out (no connection, or the server
        closed it before the request was sent), so sending it again cannot run it twice.
    """

    unsent = False


class ServerUnreachableTimeoutError(CallTimeoutError, ServerUnavailableError):
    """The deadline passed while waiting for an unreachable server.

    Raised with ``wait_for_ready=True`` when the server never became reachable
    before the call's deadline; it is both a timeout and an unavailable server.
    """


class UnknownMethodError(CourierError, AttributeError):
    """The server has no method bound under the called name."""


class SerializationError(CourierError, TypeError):
    """An argument, result or exception could not be pickled or unpickled."""


class PermissionDeniedError(CourierError, PermissionError):
    """The server refused the call: missing or wrong auth token."""


class ProtocolError(CourierError):
    """The peer is not a compatible courier server or sent malformed data."""
