"""JobQueueCluster: workers in jobs of a queue system (SLURM, SGE, PBS), the
scheduler in this process.

The scheduler runs on a background event loop of the process that made the cluster,
listening on ``interface``'s address (default: this host's). Each job runs
``processes`` workers (``python -m shoal worker``) named ``{job_name}-{job id}-{i}``,
so a worker maps to its job. ``scale`` and ``adapt`` (:mod:`shoal.deploy.elastic`)
count workers; a job is submitted per ``processes`` workers, and a job submitted but
pending counts as requested (it is "starting"), not as a worker.

A tracker lists the queue every ``poll_interval``. A job that ends without having been
asked to (its workers reached their lifetime, the walltime, ``scancel``, a node
failure) is replaced, to keep the size ``scale`` asked for (under ``adapt``, the next
round asks for what the work needs, never below ``minimum``). A worker whose lifetime
ends within a job's start-up (measured) no longer counts: its replacement is submitted
while it still works, so that the cluster does not dip below its size. With a walltime, each
worker gets a lifetime (the walltime less a margin, staggered): it hands off its data
and leaves before the queue kills it, and its job is replaced.

A job whose worker never connects (it ends first, or runs ``worker_start_timeout``
without connecting) is an error naming its log file: logged, kept in ``job_errors``,
raised by ``wait_for_workers``; that job is cancelled and not replaced.

The cluster token (generated unless given) reaches the jobs through the environment
of the submit command, which the queue system passes on to the job (``sbatch``
exports it by default; ``qsub -V``), never through the job script or a command line.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import math
import os
import socket
import sys
import time
import weakref
from collections.abc import Iterable
from typing import Any, ClassVar

import psutil

from shoal._durations import parse_duration
from shoal.client.loop import LoopRunner
from shoal.comm.security import Security
from shoal.core.scheduler.membership import DEFAULT_ALLOWED_FAILURES, DEFAULT_WORKER_TTL
from shoal.deploy.adaptive import DEFAULT_TASK_DURATION, Adaptive
from shoal.deploy.elastic import ElasticCluster
from shoal.deploy.local import _cluster_security
from shoal.jobqueue import _options as opt
from shoal.jobqueue._job import RUNNING, JobSpec, JobSystem
from shoal.jobqueue._tracker import JobTracker, TrackedJob
from shoal.protocol import messages as m

logger = logging.getLogger("shoal.jobqueue")
STARTUP_GUESS = 30.0  # seconds a job takes to start, until one has been measured
_live: weakref.WeakSet[JobQueueCluster] = weakref.WeakSet()


class JobQueueCluster(ElasticCluster):
    """Workers in queue-system jobs; see the module doc. Use a subclass:
    :class:`~shoal.jobqueue.SLURMCluster`, ``SGECluster`` or ``PBSCluster``.

    ``n_workers``: workers to start with. Per job: ``cores`` and ``memory`` (bytes or
    ``"16GB"``), split among ``processes`` workers; ``queue``, ``account``, ``walltime``
    (``"HH:MM:SS"``/``"D-HH:MM:SS"``; None: the queue's default, and no lifetime);
    ``job_extra_directives`` (directive lines, without the ``#SBATCH`` prefix) and
    ``job_script_prologue`` (shell lines before the workers); ``python`` runs the workers,
    with ``worker_extra_args`` added, ``local_directory`` for their spill files; output
    in ``log_directory`` (default: the current directory). ``interface``: the network
    interface of the scheduler and of the workers on their nodes (default: this host's
    address; workers use the one they reach the scheduler from). ``lifetime_margin``,
    ``lifetime_stagger``, ``worker_lifetime``: see :func:`~shoal.jobqueue._options.worker_lifetime`.
    ``poll_interval``: between listings of the queue; ``worker_start_timeout``: how long
    a running job may go without its worker connecting. ``security``/``token``: as
    :class:`~shoal.LocalCluster`'s.
    """

    job_system: ClassVar[type[JobSystem]]

    def __init__(
        self,
        n_workers: int = 0,
        *,
        cores: int,
        memory: str | int,
        processes: int = 1,
        queue: str | None = None,
        account: str | None = None,
        walltime: str | None = "00:30:00",
        job_extra_directives: Iterable[str] | None = None,
        job_script_prologue: Iterable[str] | None = None,
        interface: str | None = None,
        local_directory: str | None = None,
        log_directory: str | None = None,
        worker_extra_args: Iterable[str] | None = None,
        python: str = sys.executable,
        job_name: str = "shoal-worker",
        lifetime_margin: str | float | None = None,
        lifetime_stagger: str | float | None = None,
        worker_lifetime: bool = True,
        nanny: bool = True,
        security: Security | None = None,
        token: str | bool | None = None,
        poll_interval: str | float = "1s",
        worker_start_timeout: str | float = "2m",
        allowed_failures: int = DEFAULT_ALLOWED_FAILURES,
        worker_ttl: float = DEFAULT_WORKER_TTL,
        timeout: float = 60.0,
        job_system: JobSystem | None = None,
    ):
        cores = opt.positive_int(cores, "cores")
        processes = opt.positive_int(processes, "processes")
        if processes > cores:
            raise ValueError(f"processes ({processes}) cannot exceed cores ({cores})")
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 0:
            raise ValueError(f"n_workers must be an integer >= 0, not {n_workers!r}")
        if not job_name or any(c.isspace() or c in "/'\"$" for c in job_name):
            raise ValueError(f"job_name must be a non-empty word, not {job_name!r}")
        walltime_s = None if walltime is None else opt.parse_walltime(walltime)
        self.lifetime = (
            None
            if walltime_s is None or not worker_lifetime
            else opt.worker_lifetime(walltime_s, lifetime_margin, lifetime_stagger)
        )
        self.processes = processes
        self.threads_per_worker = max(1, cores // processes)
        self.n_workers = n_workers
        self.poll_interval = parse_duration(poll_interval, "poll_interval")
        self.worker_start_timeout = parse_duration(worker_start_timeout, "worker_start_timeout")
        self.timeout = timeout
        self.security = _cluster_security(security, token)
        self.status = "starting"
        self.job_errors: list[str] = []  # every job whose worker never connected
        self._unreported: list[str] = []  # of those, not yet raised by wait_for_workers
        self._startups: list[float] = []  # seconds from submitting a job to its first worker
        self._expiring: frozenset[str] = frozenset()  # replaced ahead of their lifetime's end
        self._system = job_system or self.job_system()
        self._spec_args: dict[str, Any] = dict(
            job_name=job_name,
            cores=cores,
            memory=opt.parse_memory(memory),
            processes=processes,
            walltime=walltime_s,
            queue=queue,
            account=account,
            log_directory=os.path.abspath(log_directory or os.getcwd()),
            job_extra_directives=tuple(opt.lines(job_extra_directives, "job_extra_directives")),
            job_script_prologue=tuple(opt.lines(job_script_prologue, "job_script_prologue")),
            python=python,
            interface=interface,
            local_directory=local_directory,
            lifetime=self.lifetime,
            nanny=nanny,
            worker_extra_args=tuple(opt.lines(worker_extra_args, "worker_extra_args")),
        )
        host = _interface_address(interface) if interface else _this_host()
        os.makedirs(self._spec_args["log_directory"], exist_ok=True)
        self._init_elastic()
        self._runner: LoopRunner | None = LoopRunner(name="shoal-jobqueue")
        self._scheduler: Any = None
        self._watcher: asyncio.Task[None] | None = None
        _live.add(self)
        try:
            self._runner.run_sync(self._start(host, allowed_failures, worker_ttl), timeout)
            self.status = "running"
            if n_workers:
                self.scale(n_workers)
        except BaseException:
            self.close()
            raise

    async def _start(self, host: str, allowed_failures: int, worker_ttl: float) -> None:
        from shoal.server.scheduler import Scheduler

        self._scheduler = await Scheduler(
            host,
            0,
            security=self.security,
            allowed_failures=allowed_failures,
            worker_ttl=worker_ttl,
        ).start()
        self.scheduler_address = self._scheduler.address
        spec = JobSpec(scheduler_address=self.scheduler_address, **self._spec_args)
        env = dict(os.environ)
        env.update(self.security.to_env())  # passed on to the job by the queue system
        self._tracker = JobTracker(self._system, spec, env)
        self._hook_joins()
        self._watcher = asyncio.ensure_future(self._watch())

    # ------------------------------------------------------------------ public

    def job_script(self) -> str:
        """The script every job of this cluster runs."""
        return self._system.job_script(self._tracker.spec)

    @property
    def jobs(self) -> dict[str, str]:
        """Job id -> ``"pending"`` / ``"running"``, for every job not ended."""
        return {j.id: j.state for j in self._tracker.live()}

    @property
    def jobs_submitted(self) -> int:
        """How many jobs this cluster has submitted in all (replacements too)."""
        return self._tracker.submitted

    def log_path(self, job_id: str) -> str:
        """Where job ``job_id``'s output (its workers' logs) goes."""
        return self._system.log_path(self._tracker.spec, job_id)

    def scale(self, n: int | None = None, jobs: int | None = None) -> None:
        """Run ``n`` workers, or ``jobs`` jobs (``processes`` workers each). Submitted
        jobs still pending count as requested. Stops ``adapt``."""
        self._check_running()
        if (n is None) == (jobs is None):
            raise ValueError("scale() takes either n (workers) or jobs, not both nor neither")
        if jobs is not None:
            n = opt.positive_int(jobs, "jobs") * self.processes if jobs else 0
        assert n is not None
        super().scale(n)

    def adapt(
        self,
        minimum: int = 0,
        maximum: int | float | None = None,
        target_duration: str | float = "5s",
        wait_count: int = 3,
        interval: str | float = "1s",
        default_task_duration: str | float = DEFAULT_TASK_DURATION,
        *,
        minimum_jobs: int | None = None,
        maximum_jobs: int | None = None,
    ) -> Adaptive:
        """Scale between ``minimum_jobs`` and ``maximum_jobs`` jobs (or ``minimum`` and
        ``maximum`` workers) as the work asks; see ``ElasticCluster.adapt``."""
        self._check_running()
        if minimum_jobs is not None:
            minimum = _jobs(minimum_jobs, "minimum_jobs") * self.processes
        if maximum_jobs is not None:
            maximum = _jobs(maximum_jobs, "maximum_jobs") * self.processes
        return super().adapt(
            minimum, maximum, target_duration, wait_count, interval, default_task_duration
        )

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers have joined the scheduler. A job whose worker
        never connected raises a RuntimeError naming its log file."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if self._unreported:
                error, self._unreported = self._unreported[0], []
                raise RuntimeError(error)
            if self.n_joined >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"fewer than {n} workers joined within the timeout "
                    f"(jobs: {self.jobs or 'none'}); their logs: {self._tracker.spec.log_directory}"
                )
            time.sleep(0.05)

    @property
    def n_joined(self) -> int:
        """Workers connected to the scheduler now."""
        return len(self._scheduler.state.workers) if self._scheduler is not None else 0

    # ------------------------------------------------------------------ elastic interface

    def _control_runner(self) -> LoopRunner:
        if self.status == "closed" or self._runner is None:
            raise RuntimeError("the cluster is closed")
        return self._runner

    def _check_running(self) -> None:
        if self.status != "running":
            raise RuntimeError(f"the cluster is {self.status}: it cannot scale")

    async def _start_workers(self, n: int) -> None:
        for _ in range(math.ceil(n / self.processes)):
            await self._tracker.submit()

    def _worker_names(self) -> list[str]:
        return [name for job in self._tracker.live() for name in job.names]

    def _replace_ahead(self) -> float:
        """A job's start-up (the longest of the last few measured, ``STARTUP_GUESS``
        before any) and two polls: a worker whose lifetime ends sooner no longer
        counts, so its replacement job is submitted while it still works and joins
        about when it leaves."""
        if self.lifetime is None:
            return 0.0
        startup = max(self._startups[-5:], default=STARTUP_GUESS)
        return startup + 2 * self.poll_interval

    def _newly_expiring(self) -> bool:
        """Whether a worker's lifetime came within ``_replace_ahead`` since the last look
        (then ``scale`` asks again, so that its replacement starts)."""
        if self.lifetime is None:
            return False
        end = time.time() + self._replace_ahead()
        expiring = frozenset(
            ws.name
            for ws in self._scheduler.state.workers.values()
            if ws.deadline is not None and ws.deadline <= end
        )
        new = bool(expiring - self._expiring)
        self._expiring = expiring
        return new

    async def _stop_workers(self, names: list[str]) -> None:
        """Cancel the jobs all of whose workers are to stop (pending ones, mostly)."""
        going = set(names) | self._leaving
        await self._tracker.cancel([j for j in self._tracker.live() if going.issuperset(j.names)])

    # ------------------------------------------------------------------ watching the queue

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self._watch_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # squeue failing now and then: look again next time
                logger.warning("watching the jobs: %s: %s", type(e).__name__, e)

    def _hook_joins(self) -> None:
        """Note each job whose worker joins as it joins: a worker may join and be gone
        (its job cancelled, its node lost) before the next poll of the queue, and must
        not count as one that never connected."""
        state = self._scheduler.state
        add_worker = state.add_worker

        def noting_add_worker(*args: Any, **kwargs: Any) -> Any:
            record = add_worker(*args, **kwargs)
            job = self._tracker.job_of(record.name)
            if job is not None:
                if not job.joined:  # from submission to its first worker: its start-up
                    self._startups.append(time.monotonic() - job.submitted_at)
                job.joined.add(record.name)
            return record

        state.add_worker = noting_add_worker

    def _note_joins(self) -> None:
        joined = {ws.name for ws in self._scheduler.state.workers.values()}
        for job in self._tracker.live():
            job.joined.update(joined.intersection(job.names))

    async def _watch_once(self) -> None:
        self._note_joins()
        ended = await self._tracker.poll()
        self._note_joins()
        now = time.monotonic()
        for job in ended:
            # Told to go (cancelled, or every worker retired by scale-down): expected.
            job.stop_requested = job.stop_requested or self._leaving.issuperset(job.names)
            if not job.joined and not job.stop_requested:
                self._job_failed(job, "ended before its worker connected to the scheduler")
        stuck = [
            j
            for j in self._tracker.live()
            if j.state == RUNNING
            and not j.joined
            and j.started_at is not None
            and now - j.started_at > self.worker_start_timeout
        ]
        for job in stuck:
            self._job_failed(
                job,
                f"has run {self.worker_start_timeout:g}s (worker_start_timeout) without its "
                "worker connecting to the scheduler: cancelled",
            )
        if stuck:
            await self._tracker.cancel(stuck)
        lost = [j for j in ended if not j.stop_requested and not j.error]
        if lost:
            logger.info("jobs ended: %s", ", ".join(j.id for j in lost))
        if (lost or self._newly_expiring()) and self.adaptive is None and self.status == "running":
            # Keep the size scale() asked for (adapt's next round does this itself).
            await self._scale(lambda names: lambda rid: m.ScaleRequest(rid, names, self.n_workers))

    def _job_failed(self, job: TrackedJob, what: str) -> None:
        job.error = (
            f"job {job.id} {what}; its log: {job.log_path} (scheduler {self.scheduler_address})"
        )
        logger.error("%s", job.error)
        self.job_errors.append(job.error)
        self._unreported.append(job.error)

    # ------------------------------------------------------------------ closing

    def close(self, timeout: float = 30.0) -> None:
        """Stop adapting, cancel every job this cluster submitted (waiting until the
        queue lists none), and stop the scheduler."""
        if self.status == "closed":
            return
        if self.status == "running":
            self._close_elastic()
        self.status = "closing"
        runner, self._runner = self._runner, None
        if runner is None:
            self.status = "closed"
            return
        try:
            if self._scheduler is not None:
                runner.run_sync(self._cancel_all(timeout), timeout + 10)
        finally:
            self.status = "closed"
            runner.stop()

    async def _cancel_all(self, timeout: float) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        tracker = getattr(self, "_tracker", None)
        deadline = time.monotonic() + timeout
        try:
            while tracker is not None and tracker.listed():
                await tracker.cancel(tracker.listed())
                await asyncio.sleep(0.2)
                await tracker.poll()
                if time.monotonic() > deadline:
                    ids = ", ".join(j.id for j in tracker.listed())
                    logger.error("jobs still in the queue after cancelling them: %s", ids)
                    break
        finally:
            await self._scheduler.close()

    def __enter__(self) -> JobQueueCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({getattr(self, 'scheduler_address', '')!r}, "
            f"workers={self.n_joined}, jobs={len(self.jobs) if self.status == 'running' else 0}, "
            f"status={self.status!r})"
        )


def _jobs(value: Any, option: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{option} must be an integer >= 0, not {value!r}")
    return value


def _interface_address(interface: str) -> str:
    addresses = psutil.net_if_addrs()
    if interface not in addresses:
        raise ValueError(
            f"interface {interface!r} is not one of this machine's: {', '.join(sorted(addresses))}"
        )
    for a in addresses[interface]:
        if a.family == socket.AF_INET:
            return str(a.address)
    raise ValueError(f"interface {interface!r} has no IPv4 address")


def _this_host() -> str:
    """This host's address, as its name resolves (the address other nodes reach)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@atexit.register
def _close_all() -> None:
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.close(timeout=10)
