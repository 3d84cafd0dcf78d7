"""The jobs a cluster submitted, as the queue system last listed them.

The tracker runs the queue system's commands (submit, cancel, list) as subprocesses
and keeps, per job: its worker names, its log file, and its state (pending, running,
ended). A job the listing no longer shows has ended, whatever the reason (its workers
left, the walltime, ``scancel``, a node failure); the cluster decides what follows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import logging
import time

from shoal.jobqueue._job import ENDED, PENDING, RUNNING, JobSpec, JobSystem

logger = logging.getLogger("shoal.jobqueue")
COMMAND_TIMEOUT = 60.0


class JobCommandError(RuntimeError):
    """A queue command (``sbatch``, ``qsub``, ``squeue``...) is missing or failed."""


@dataclasses.dataclass(eq=False)
class TrackedJob:
    id: str
    names: list[str]  # its workers' names
    log_path: str
    submitted_at: float
    state: str = PENDING
    started_at: float | None = None  # first seen running
    ended_at: float | None = None
    listed: bool = True  # in the queue's latest listing (an ended job may still be)
    stop_requested: bool = False  # we cancelled it, or its workers were told to leave
    joined: set[str] = dataclasses.field(default_factory=set)  # names seen at the scheduler
    error: str = ""  # why it failed (its worker never connected)


class JobTracker:
    def __init__(self, system: JobSystem, spec: JobSpec, env: dict[str, str]):
        self.system = system
        self.spec = spec
        self.env = env  # for every command: sbatch/qsub pass it on to the job
        self.user = getpass.getuser()
        self.jobs: dict[str, TrackedJob] = {}  # every job submitted, ended ones too
        self.by_worker: dict[str, TrackedJob] = {}  # worker name -> its job
        self.submitted = 0

    def job_of(self, worker_name: str) -> TrackedJob | None:
        return self.by_worker.get(worker_name)

    def live(self) -> list[TrackedJob]:
        return [j for j in self.jobs.values() if j.state != ENDED]

    def listed(self) -> list[TrackedJob]:
        return [j for j in self.jobs.values() if j.listed]

    async def submit(self) -> TrackedJob:
        script = self.system.job_script(self.spec)
        out = await self._call(self.system.submit_args(), script)
        job_id = self.system.parse_job_id(out)
        names = [self.system.worker_name(self.spec, job_id, i) for i in range(self.spec.processes)]
        job = TrackedJob(job_id, names, self.system.log_path(self.spec, job_id), time.monotonic())
        self.jobs[job_id] = job
        self.by_worker.update(dict.fromkeys(names, job))
        self.submitted += 1
        logger.info("submitted job %s (workers %s)", job_id, ", ".join(names))
        return job

    async def cancel(self, jobs: list[TrackedJob]) -> None:
        """Cancel ``jobs`` (those already gone are no error)."""
        ids = [j.id for j in jobs if j.listed]
        for job in jobs:
            job.stop_requested = True
        if ids:
            try:
                await self._call(self.system.cancel_args(ids))
            except JobCommandError as e:  # a job that ended meanwhile makes scancel complain
                logger.info("cancelling %s: %s", ", ".join(ids), e)

    async def poll(self) -> list[TrackedJob]:
        """List the queue; return the jobs seen to end since the last poll."""
        asked = time.monotonic()
        out = await self._call(self.system.status_args(self.user))
        states = self.system.parse_status(out)
        now = time.monotonic()
        ended = []
        for job in self.jobs.values():
            if job.submitted_at >= asked and job.id not in states:
                # Submitted while the queue was being listed (scaling runs alongside
                # the watch): absent from a listing taken before it existed, not ended.
                continue
            job.listed = job.id in states
            state = states.get(job.id, ENDED)
            if job.state == ENDED:
                continue
            if state == RUNNING and job.started_at is None:
                job.started_at = now
            if state == ENDED:
                job.ended_at = now
                ended.append(job)
            job.state = state
        return ended

    async def _call(self, args: list[str], stdin: str | None = None) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env,
            )
        except FileNotFoundError:
            raise JobCommandError(
                f"{args[0]!r} was not found: is the {self.system.name} client installed "
                "and on PATH on this machine?"
            ) from None
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), COMMAND_TIMEOUT
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise JobCommandError(
                f"{' '.join(args)} did not answer in {COMMAND_TIMEOUT:g}s"
            ) from None
        if proc.returncode:
            raise JobCommandError(
                f"{' '.join(args)} failed (exit code {proc.returncode}): "
                f"{err.decode(errors='replace').strip() or out.decode(errors='replace').strip()}"
            )
        return out.decode(errors="replace")
