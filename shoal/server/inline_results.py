"""Which results a worker sends inline with ``TaskFinished``.

The scheduler marks a ``ComputeTask`` whose key a client wants (``client_wants``); the
result of such a task rides with its completion when its serialised form is at most
``shoal.worker.inline-results-bytes``, so the client needs no ``WhoHas``/``GetData``
round trips. Other results are inlined only when they are small plain values (as
before), which costs no pickling.
"""

from __future__ import annotations

from typing import Any

from shoal import config
from shoal.protocol import messages as m
from shoal.protocol.serialize import dumps_inline, dumps_result_inline


class InlineResults:
    """Keys of this worker's tasks whose result a client wants. Written on the worker's
    loop, read by its task threads (single set operations, atomic under the GIL)."""

    def __init__(self, limit: int | None = None):
        limit = config.get("worker.inline-results-bytes") if limit is None else limit
        if type(limit) is not int or limit < 0:
            raise ValueError(
                f"shoal.worker.inline-results-bytes must be a number of bytes >= 0, not {limit!r}"
            )
        self.limit = limit
        self._wanted: set[Any] = set()

    def note(self, msg: m.Message) -> None:
        """A message from the scheduler, on the loop."""
        t = type(msg)
        if t is m.ComputeTask:
            if msg.client_wants:  # type: ignore[attr-defined]
                self._wanted.add(msg.key)  # type: ignore[attr-defined]
        elif t is m.FreeKeys:
            self._wanted.difference_update(msg.keys)  # type: ignore[attr-defined]
        elif t is m.ReleaseCompute:
            self._wanted.discard(msg.key)  # type: ignore[attr-defined]

    def dumps(self, key: Any, value: Any, nbytes: int) -> m.Payload | None:
        """The inline payload of ``key``'s result, or None; in the task's thread, once
        per execution (a later execution of the key is marked by its own ComputeTask)."""
        if key in self._wanted:
            self._wanted.discard(key)
            return dumps_result_inline(value, self.limit, nbytes)
        return dumps_inline(value)
