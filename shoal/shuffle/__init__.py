"""shoal's peer-to-peer shuffle for dask.dataframe.

- :mod:`._dask` teaches dask.dataframe to pick it (while a shoal client is Dask's
  scheduler) and builds the graph: transfer tasks, a barrier, unpack tasks.
- :mod:`._scheduler` is the scheduler's part (pure): participants, the map of output
  partitions to them, restrictions, pins, restarts when a participant dies, events.
- :mod:`._worker` is the worker's part: pieces sent worker to worker with
  back-pressure, buffered in memory and spilled to disk past a limit.
- :mod:`._disk` holds the spill files (one per output partition, Arrow batches).
- :mod:`._tasks` holds the task functions, :mod:`._split` the splitting and packing.

It does not need the ``distributed`` package.
"""

from shoal.shuffle._dask import DiskShuffleRefused

__all__ = ["DiskShuffleRefused"]
