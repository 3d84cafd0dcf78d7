"""The job tracker against an in-memory queue: what a listing may conclude."""

from __future__ import annotations

import asyncio

from shoal.jobqueue._job import ENDED, PENDING, JobSpec
from shoal.jobqueue._slurm import SLURMJob
from shoal.jobqueue._tracker import JobTracker


def spec(tmp_path) -> JobSpec:
    return JobSpec(
        job_name="shoal-worker",
        cores=1,
        memory=500_000_000,
        processes=1,
        walltime=None,
        queue=None,
        account=None,
        log_directory=str(tmp_path),
        job_extra_directives=(),
        job_script_prologue=(),
        python="python",
        scheduler_address="tcp://127.0.0.1:1",
        interface=None,
        local_directory=None,
        lifetime=None,
        nanny=False,
        worker_extra_args=(),
    )


class QueueInMemory(JobTracker):
    """sbatch and squeue on a dict. A listing is taken when squeue starts and returned
    only once ``answer`` is set, as a real squeue's output is read a while later."""

    def __init__(self, tmp_path) -> None:
        super().__init__(SLURMJob(), spec(tmp_path), env={})
        self.queue: dict[str, str] = {}
        self.answer = asyncio.Event()
        self.listing_taken = asyncio.Event()
        self.next_id = 100

    async def _call(self, args: list[str], stdin: str | None = None) -> str:
        if args[0] == "sbatch":
            self.next_id += 1
            self.queue[str(self.next_id)] = "PENDING"
            return f"{self.next_id}\n"
        if args[0] == "squeue":
            listing = "".join(f"{job_id} {state}\n" for job_id, state in self.queue.items())
            self.listing_taken.set()
            await self.answer.wait()
            return listing
        raise AssertionError(f"unexpected command {args}")


def test_a_job_submitted_while_the_queue_is_listed_has_not_ended(tmp_path):
    async def main() -> None:
        tracker = QueueInMemory(tmp_path)
        first = await tracker.submit()
        polling = asyncio.create_task(tracker.poll())
        await tracker.listing_taken.wait()
        fresh = await tracker.submit()  # scaling up, alongside the watch
        tracker.answer.set()
        assert await polling == []
        assert first.state == PENDING and fresh.state == PENDING
        assert fresh in tracker.live()
        # The next listing shows it: judged by that one as usual.
        assert await tracker.poll() == []
        del tracker.queue[fresh.id]  # now it ends (scancel, the walltime...)
        assert await tracker.poll() == [fresh]
        assert fresh.state == ENDED and fresh not in tracker.live()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_job_gone_from_the_listing_has_ended(tmp_path):
    async def main() -> None:
        tracker = QueueInMemory(tmp_path)
        tracker.answer.set()
        job = await tracker.submit()
        del tracker.queue[job.id]
        assert await tracker.poll() == [job]
        assert job.state == ENDED and not job.listed

    asyncio.run(asyncio.wait_for(main(), 10))
