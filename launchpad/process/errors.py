"""`NodeFailedError`: what a program's failure raises, naming the node and every traceback it
left."""
from __future__ import annotations

from typing import List, Tuple


class NodeFailedError(RuntimeError):
    """A node of the program failed; the program was stopped because of it.

    Attributes:
      node_name: the failing node, 'group/index'.
      message: its error message.
      remote_traceback: the traceback text printed where it failed (for a node that was
        restarted, every failure's, oldest first).
      failures: (message, traceback) of each failure of the node, oldest first.
    """

    def __init__(self, node_name: str, message: str, remote_traceback: str = '',
                 failures: Tuple[Tuple[str, str], ...] = ()):
        self.node_name = node_name
        self.message = message
        self.remote_traceback = remote_traceback
        self.failures = tuple(failures) or ((message, remote_traceback),)
        text = f'Node {node_name} failed: {message}'
        if remote_traceback:
            text += f'\n\nTraceback in {node_name}:\n{remote_traceback.rstrip()}'
        super().__init__(text)

    def __reduce__(self):
        return type(self), (self.node_name, self.message, self.remote_traceback, self.failures)


def all_tracebacks(failures: List[Tuple[str, str]]) -> str:
    """The tracebacks of a node's failures, each under a line saying which one it was."""
    if len(failures) == 1:
        return failures[0][1]
    return '\n'.join(f'--- failure {i} of {len(failures)}: {message}\n{text.rstrip()}\n'
                     for i, (message, text) in enumerate(failures, 1))
