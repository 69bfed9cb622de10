"""The state of one node as the coordinator tracks it and launchers, the CLI and dashboards show it.

Kept apart from `coordinator` so that what only reads states (the control face, the observers,
the elastic groups) does not import the coordinator itself.
"""

import dataclasses
import enum
from typing import Optional


class NodeState(str, enum.Enum):
    PENDING = 'pending'
    RUNNING = 'running'
    FINISHED = 'finished'
    FAILED = 'failed'
    KILLED = 'killed'          # ended by the program's stop (also one whose restart it cancelled)
    RESTARTING = 'restarting'  # failed; starts again once its process is gone and its backoff over
    DROPPED = 'dropped'        # failed for good under on_failure='drop'; the program goes on
    REMOVED = 'removed'        # taken out of the running program (`Controller.remove_node`)

    @property
    def ended(self) -> bool:
        return self in (NodeState.FINISHED, NodeState.FAILED, NodeState.KILLED, NodeState.DROPPED,
                        NodeState.REMOVED)


@dataclasses.dataclass
class NodeStatus:
    """How one executable of the program is doing."""
    name: str
    state: NodeState = NodeState.PENDING
    pid: Optional[int] = None
    host: Optional[str] = None
    exit_code: Optional[int] = None
    error: Optional[str] = None
    restarts: int = 0
    started_at: Optional[float] = None  # wall-clock time the coordinator heard its run start
    devices: str = ''  # the GPUs the launcher gave it ('none': none; '': left alone)
    cores: str = ''    # the cores it is pinned to ('': not pinned)
