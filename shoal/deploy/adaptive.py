"""``cluster.adapt(...)``: a loop that asks the scheduler, every ``interval``, how many
workers the work needs, and has the cluster carry it out.

The decision is the scheduler core's (:mod:`shoal.core.scheduler.adaptive`, which keeps the
policy's memory of lower proposals between requests; ``workers_to_close`` picks and
retires the workers to close). This loop only asks and carries out: it runs as a task
on the cluster's control loop (:class:`~shoal.deploy.elastic.ElasticCluster`) and
stops with ``.stop()``, a new ``adapt``, a ``scale``, or the cluster's close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from typing import TYPE_CHECKING, Any

from shoal._durations import parse_duration
from shoal.core.scheduler.adaptive import DEFAULT_TASK_DURATION, AdaptivePolicy
from shoal.protocol import messages as m

if TYPE_CHECKING:
    from shoal.deploy.elastic import ElasticCluster

logger = logging.getLogger("shoal.adaptive")


class Adaptive:
    """A running ``cluster.adapt(...)``; ``stop()`` ends it (the workers stay)."""

    def __init__(
        self,
        cluster: ElasticCluster,
        minimum: int = 0,
        maximum: int | float | None = None,
        target_duration: str | float = "5s",
        wait_count: int = 3,
        interval: str | float = "1s",
        default_task_duration: str | float = DEFAULT_TASK_DURATION,
    ):
        limit = _maximum(maximum)
        self.target_duration = parse_duration(target_duration, "target_duration")
        self.interval = parse_duration(interval, "interval")
        self.default_task_duration = parse_duration(default_task_duration, "default_task_duration")
        # The same checks as the core's, here so that a bad value fails in the caller.
        AdaptivePolicy(minimum, limit, self.target_duration, wait_count, self.default_task_duration)
        self.minimum = minimum
        self.maximum = limit
        self.wait_count = wait_count
        self.cluster = cluster
        self.session = f"adaptive-{uuid.uuid4().hex[:12]}"
        self.last: m.ScaleReply | None = None  # the scheduler's latest answer
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return (
            f"<Adaptive {state} minimum={self.minimum} maximum={self.maximum} "
            f"target_duration={self.target_duration:g}s wait_count={self.wait_count} "
            f"interval={self.interval:g}s>"
        )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def request(self, workers: list[str], threads_per_worker: int) -> Any:
        """What to send the scheduler, as ``make(request_id)``."""
        return lambda rid: m.ScaleRequest(
            rid,
            workers,
            -1,
            self.session,
            self.minimum,
            -1 if self.maximum is None else self.maximum,
            self.target_duration,
            self.wait_count,
            self.default_task_duration,
            threads_per_worker,
        )

    async def _run(self) -> None:
        # Checked as well as cancelled: on Python 3.11 a cancel that meets a reply
        # arriving inside asyncio.wait_for can be swallowed, and the loop would go on.
        while not self._stopping:
            try:
                self.last = await self.cluster._adapt_once(self)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the scheduler gone, a worker failing to start: try again
                logger.warning("adaptive: %s: %s", type(e).__name__, e)
            await asyncio.sleep(self.interval)

    async def _stop(self) -> None:
        self._stopping = True
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stop(self) -> None:
        """Stop adapting (idempotent); the workers there stay."""
        self.cluster._stop_adaptive(self)


def _maximum(maximum: Any) -> int | None:
    """None (no maximum) for None or infinity; a whole float as an int."""
    if isinstance(maximum, float) and math.isinf(maximum) and maximum > 0:
        return None
    if isinstance(maximum, float) and maximum.is_integer():
        return int(maximum)
    return maximum  # checked by AdaptivePolicy
