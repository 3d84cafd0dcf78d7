"""Errors the cluster itself raises on futures (pickled by the scheduler, which only
ever pickles these, never user objects)."""

from __future__ import annotations

from typing import Any


class KilledWorker(Exception):
    """A task was running on ``allowed_failures + 1`` workers that each died while it
    ran: it is probably what kills them (memory, a segfault), so it is not tried again.

    ``reasons``: why a worker died, for those whose death had a known cause (its
    nanny's report, e.g. "killed for memory: 1900 MB, over the terminate threshold").
    """

    def __init__(
        self,
        key: Any,
        workers: list[str],
        allowed_failures: int,
        reasons: dict[str, str] | None = None,
    ):
        self.key = key
        self.workers = list(workers)
        self.allowed_failures = allowed_failures
        self.reasons = dict(reasons or {})
        named = [f"{w} ({self.reasons[w]})" if self.reasons.get(w) else w for w in self.workers]
        if any("memory" in why for why in self.reasons.values()):
            hint = "It probably takes more memory than a worker has (see the reasons)."
        else:
            hint = "It may be what kills them (memory, a crash); see those workers' logs."
        super().__init__(
            f"task {key!r} was running on {len(self.workers)} workers that died while it "
            f"ran (allowed failures: {allowed_failures}): {', '.join(named)}. {hint}"
        )

    def __reduce__(self) -> Any:
        return (KilledWorker, (self.key, self.workers, self.allowed_failures, self.reasons))


class TaskInterrupted(BaseException):
    """Raised inside a running task's thread when the task is cancelled with
    ``client.cancel(futures, force=True)``.

    A ``BaseException`` (as ``KeyboardInterrupt``), so that ``except Exception:`` in a
    task does not swallow it; ``finally`` blocks and ``with`` exits run as usual. It is
    delivered only while the thread runs Python bytecode: a task blocked in C (a
    ``time.sleep``, a lock, I/O, a C extension holding the GIL or not) sees it only once
    it returns to Python, and the worker is restarted if that takes longer than the
    grace period. Its future is cancelled already: nobody sees this error as a result."""
