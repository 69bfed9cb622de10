"""`lp.Pool`: multiprocessing's Pool over launchpad worker nodes, resilient to worker deaths.

`pool.py` has the public class, `dispatch.py` the task table and re-queueing, `results.py` what
callers wait on, `worker.py` the worker object and node. See docs/pool.md.
"""
from launchpad.pool.dispatch import PoolTerminatedError, WorkerLostError
from launchpad.pool.pool import Pool
from launchpad.pool.results import AsyncResult, IMapIterator, IMapUnorderedIterator, MapResult
from launchpad.pool.worker import PoolWorker, PoolWorkerNode, WorkerRef

__all__ = ['AsyncResult', 'IMapIterator', 'IMapUnorderedIterator', 'MapResult', 'Pool',
           'PoolTerminatedError', 'PoolWorker', 'PoolWorkerNode', 'WorkerLostError', 'WorkerRef']
