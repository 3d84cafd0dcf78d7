"""LocalCluster: a scheduler and workers on this machine.

``processes=True`` (the default) starts the scheduler and each worker as its own
process, exactly as ``shoal scheduler`` / ``shoal worker`` would, each worker under a
nanny process that restarts it if it dies (``nanny=False``: none); ``processes=False``
runs them all on one background event loop in this process (tests, notebooks).
Every listener binds to loopback unless told otherwise.

``scale(n)`` and ``adapt(...)`` (see :mod:`shoal.deploy.elastic`) start workers under
new names, or have the scheduler retire extra ones gracefully; a retired worker's
process (and its nanny) exits, and is reaped here, never restarted.

Every connection proves a cluster token, generated per cluster unless given
(``token=False``: none); child processes get it through their environment, never
their command line (which any user of the machine can read). ``cluster.security``
is what a ``Client(cluster)`` uses to connect.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Mapping
from typing import Any

import psutil

from shoal.client.loop import LoopRunner, ThreadCall, run
from shoal.comm.security import Security, generate_token
from shoal.config import CONFIGURED, resolve
from shoal.deploy.cluster_view import ClusterViewMixin
from shoal.deploy.elastic import ElasticCluster
from shoal.protocol.messages import check_resources

_live: weakref.WeakSet[LocalCluster] = weakref.WeakSet()
DEFAULT_DASHBOARD: Any = "<loopback, a free port>"  # dashboard_address left out


class LocalCluster(ClusterViewMixin, ElasticCluster):
    def __init__(
        self,
        n_workers: int | None = None,
        threads_per_worker: int | None = None,
        processes: bool = True,
        host: str = "127.0.0.1",
        timeout: float = 60.0,
        validate: bool = False,
        resources: Mapping[str, float] | None = None,
        security: Security | None = None,
        token: str | bool | None = None,
        nanny: bool = True,
        memory_limit: str | float | None = CONFIGURED,
        memory_target_fraction: float | None = CONFIGURED,
        memory_spill_fraction: float | None = CONFIGURED,
        memory_pause_fraction: float | None = CONFIGURED,
        memory_terminate_fraction: float | None = CONFIGURED,
        local_directory: str | None = None,
        allowed_failures: int = CONFIGURED,
        worker_ttl: float = CONFIGURED,
        interrupt_grace: float = CONFIGURED,
        lifetime: str | float | None = None,
        lifetime_stagger: str | float = 0,
        lifetime_restart: bool | None = None,
        max_tasks: int | None = None,
        work_stealing: bool = True,
        worker_dashboard_address: str | None = None,
        dashboard_address: str | None = DEFAULT_DASHBOARD,
    ):
        from shoal.server.memory import MemoryFractions, parse_memory_limit

        # Left out: from the config (shoal.*, or the distributed.* equivalent).
        memory_limit = resolve(memory_limit, "worker.memory.limit")
        memory_target_fraction = resolve(memory_target_fraction, "worker.memory.target")
        memory_spill_fraction = resolve(memory_spill_fraction, "worker.memory.spill")
        memory_pause_fraction = resolve(memory_pause_fraction, "worker.memory.pause")
        memory_terminate_fraction = resolve(memory_terminate_fraction, "worker.memory.terminate")
        allowed_failures = resolve(allowed_failures, "scheduler.allowed-failures")
        worker_ttl = resolve(worker_ttl, "scheduler.worker-ttl")
        interrupt_grace = resolve(interrupt_grace, "worker.interrupt-grace")

        ncores = os.cpu_count() or 1
        if n_workers is None:
            n_workers = max(1, ncores // (threads_per_worker or 1)) if processes else 1
            n_workers = min(n_workers, 8)
        if threads_per_worker is None:
            threads_per_worker = max(1, ncores // n_workers) if n_workers else 1
        if n_workers < 0 or threads_per_worker < 1:
            raise ValueError("n_workers must be >= 0 and threads_per_worker >= 1")
        self.n_workers = n_workers
        self.threads_per_worker = threads_per_worker
        self.processes = processes
        self.host = host
        self.timeout = timeout
        self.validate = validate
        self.allowed_failures = allowed_failures  # deaths under a task before KilledWorker
        self.worker_ttl = worker_ttl  # seconds without a heartbeat before a worker is removed
        self.work_stealing = work_stealing  # queued tasks move from busy to idle workers
        # "[host]:port" (default: loopback, a free port); None: no dashboard.
        self.dashboard_address = (
            f"{host}:0" if dashboard_address is DEFAULT_DASHBOARD else dashboard_address
        )
        self.dashboard_port = 0  # once the scheduler listens
        self.interrupt_grace = interrupt_grace  # then a force-cancelled stuck task restarts it
        self.resources = check_resources(resources or {})  # every worker's, e.g. {"GPU": 1}
        # Each worker's HTTP port (/metrics), e.g. ":0"; None: none (as Dask's LocalCluster)
        self.worker_dashboard_address = worker_dashboard_address
        self.security = _cluster_security(security, token)
        self.nanny = nanny and processes
        # Walltime (shoal worker --lifetime, --max-tasks): a worker at its end is started
        # afresh by its nanny by default, so that the cluster does not dwindle.
        self.walltime = _walltime(
            lifetime, lifetime_stagger, lifetime_restart, max_tasks, self.nanny
        )
        # per worker: "auto" shares this machine's memory in proportion to threads
        self.memory_limit = parse_memory_limit(memory_limit, threads_per_worker)
        self.memory_fractions = MemoryFractions(
            memory_target_fraction,
            memory_spill_fraction,
            memory_pause_fraction,
            memory_terminate_fraction,
        )
        self.scheduler_address = ""
        self.status = "starting"
        self._dir = tempfile.mkdtemp(prefix="shoal-cluster-", dir=local_directory)
        self._procs: list[subprocess.Popen[bytes]] = []  # the scheduler's first
        self._runner: LoopRunner | None = None
        self._scheduler: Any = None
        self._workers: list[Any] = []  # in process
        self._by_name: dict[str, Any] = {}  # worker name -> its process (or Worker)
        self._names = (str(i) for i in itertools.count())
        self._control_loop: LoopRunner | None = None  # processes: scale/adapt's loop
        self._init_elastic()
        _live.add(self)
        try:
            if processes:
                self._start_processes()
            else:
                self._start_in_process()
        except BaseException:
            self.close()
            raise
        self.status = "running"

    # ---------------------------------------------------------------- processes

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Workers import the caller's modules by name: give them the same path.
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
        env.update(self.security.to_env())  # the token goes here, not on the command line
        return env

    def _spawn(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", *args],
            env=self._child_env(),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is ours to handle
        )
        self._procs.append(proc)
        return proc

    def _start_processes(self) -> None:
        sched_file = os.path.join(self._dir, "scheduler.json")
        self._spawn(
            "scheduler",
            "--host",
            self.host,
            "--port",
            "0",
            "--scheduler-file",
            sched_file,
            "--watch-pid",
            str(os.getpid()),
            "--quiet",  # the address is ours to report, not the user's stdout's
            *(["--validate"] if self.validate else []),
            *("--allowed-failures", str(self.allowed_failures)),
            *("--worker-ttl", str(self.worker_ttl)),
            *([] if self.work_stealing else ["--no-work-stealing"]),
            *(
                ["--no-dashboard"]
                if self.dashboard_address is None
                else ["--dashboard-address", self.dashboard_address]
            ),
        )
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(sched_file):
            if self._procs[0].poll() is not None:
                raise RuntimeError(f"the scheduler exited with code {self._procs[0].returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scheduler did not start within {self.timeout}s")
            time.sleep(0.01)
        with open(sched_file) as f:
            info = json.load(f)
        self.scheduler_address = info["address"]
        self.dashboard_port = int(info.get("dashboard_port", 0))
        for _ in range(self.n_workers):
            self._spawn_worker(next(self._names))
        self.wait_for_workers(self.n_workers, max(1.0, deadline - time.monotonic()))

    def _spawn_worker(self, name: str) -> None:
        fractions = zip(
            ("target", "spill", "pause", "terminate"), self.memory_fractions, strict=True
        )
        self._by_name[name] = self._spawn(
            "worker",
            self.scheduler_address,
            "--nthreads",
            str(self.threads_per_worker),
            "--name",
            name,
            "--host",
            self.host,
            "--nanny" if self.nanny else "--no-nanny",
            "--memory-limit",
            "none" if self.memory_limit is None else str(self.memory_limit),
            *[a for name, f in fractions for a in (f"--memory-{name}-fraction", f"{f or 'off'}")],
            "--local-directory",
            self._dir,
            *(["--validate"] if self.validate else []),
            *(["--resources", _format_resources(self.resources)] if self.resources else []),
            *("--interrupt-grace", str(self.interrupt_grace)),
            *self.walltime.cli_args(),
            *(
                ["--dashboard-address", self.worker_dashboard_address]
                if self.worker_dashboard_address is not None
                else ["--no-dashboard"]
            ),
        )

    def wait_for_workers(self, n: int, timeout: float | None = None) -> None:
        """Block until ``n`` workers have joined the scheduler."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            leaving = [self._by_name.get(name) for name in self._leaving]
            dead = [p for p in self._procs if p.poll() is not None and p not in leaving]
            if dead:
                raise RuntimeError(f"a cluster process exited with code {dead[0].returncode}")
            if len(self._info_reply().workers) >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} workers joined within the timeout")
            time.sleep(0.02)

    def _info_reply(self) -> Any:
        """The scheduler's InfoReply, asked on a connection of its own (from a helper
        thread: the caller may be inside an event loop)."""
        from shoal.comm.tcp import connect
        from shoal.protocol import messages as m

        async def ask() -> m.InfoReply:
            hello = m.Hello(m.PROTOCOL_VERSION, "client", name="local-cluster", subscribe=False)
            conn, _ = await connect(self.scheduler_address, hello, security=self.security)
            try:
                reply, _ = await conn.request(lambda rid: m.InfoRequest(rid), timeout=10)
                assert isinstance(reply, m.InfoReply)
                return reply
            finally:
                conn.close()

        return _in_thread(lambda: run(ask()))

    # ---------------------------------------------------------------- one process

    def _start_in_process(self) -> None:
        from shoal.server.scheduler import Scheduler

        self._runner = LoopRunner(name="shoal-local-cluster")

        async def start() -> None:
            self._scheduler = await Scheduler(
                self.host,
                0,
                validate=self.validate,
                security=self.security,
                allowed_failures=self.allowed_failures,
                worker_ttl=self.worker_ttl,
                work_stealing=self.work_stealing,
                dashboard_address=self.dashboard_address,
            ).start()
            self.scheduler_address = self._scheduler.address
            self.dashboard_port = self._scheduler.dashboard_port
            for _ in range(self.n_workers):
                await self._start_in_process_worker(next(self._names))

        self._runner.run_sync(start(), self.timeout)

    async def _start_in_process_worker(self, name: str) -> None:
        from shoal.server.worker import Worker

        w = Worker(
            self.scheduler_address,
            self.threads_per_worker,
            name=name,
            host=self.host,
            validate=self.validate,
            resources=self.resources,
            security=self.security,
            memory_limit=self.memory_limit,
            interrupt_grace=self.interrupt_grace,
            # the process's memory is every worker's: only the target applies
            memory_fractions=self.memory_fractions._replace(spill=None, pause=None, terminate=None),
            local_directory=self._dir,
            dashboard_address=self.worker_dashboard_address,
            **self.walltime.worker_kwargs(),
        )
        self._workers.append(w)
        self._by_name[name] = w
        await w.start()

    # ---------------------------------------------------------------- scale and adapt

    def _control_runner(self) -> LoopRunner:
        if self.status == "closed":
            raise RuntimeError("the cluster is closed")
        if self._runner is not None:
            return self._runner  # in process: the scheduler's own loop
        if self._control_loop is None:
            self._control_loop = LoopRunner(name="shoal-cluster-control")
        return self._control_loop

    def scale(self, n: int) -> None:
        self._check_running()
        super().scale(n)

    def adapt(self, *args: Any, **kwargs: Any) -> Any:
        self._check_running()
        return super().adapt(*args, **kwargs)

    adapt.__doc__ = ElasticCluster.adapt.__doc__
    scale.__doc__ = ElasticCluster.scale.__doc__

    def _check_running(self) -> None:
        if self.status != "running":
            raise RuntimeError(f"the cluster is {self.status}: it cannot scale")

    async def _start_workers(self, n: int) -> None:
        for _ in range(n):
            name = next(self._names)
            if self.processes:
                self._spawn_worker(name)
            else:
                await self._start_in_process_worker(name)

    def _worker_names(self) -> list[str]:
        """The workers this cluster runs, joined or starting; those that exited are
        forgotten here (their processes reaped)."""
        for name, w in list(self._by_name.items()):
            if self.processes:
                if w.poll() is not None:  # poll() reaps it
                    del self._by_name[name]
                    with contextlib.suppress(ValueError):
                        self._procs.remove(w)
            elif w._closed.is_set():
                del self._by_name[name]
                with contextlib.suppress(ValueError):
                    self._workers.remove(w)
        return list(self._by_name)

    async def _stop_workers(self, names: list[str]) -> None:
        """Workers that have not joined yet: a nanny stops its worker and exits; a
        worker without one leaves (it has nothing to hand off)."""
        for name in names:
            w = self._by_name.get(name)
            if w is None:
                continue
            if self.processes:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            else:
                await w.close("stopped by scale")

    # ---------------------------------------------------------------- closing

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' pids, in worker order. Under nannies these are the
        nannies' children now: a worker being restarted is left out until it is back."""
        if not self.nanny:
            return [p.pid for p in self._procs[1:]]
        pids: list[int] = []
        for nanny in self._procs[1:]:
            with contextlib.suppress(psutil.Error):
                pids.extend(child.pid for child in psutil.Process(nanny.pid).children())
        return pids

    @property
    def nanny_pids(self) -> list[int]:
        """The nannies' pids, in worker order (none without nannies)."""
        return [p.pid for p in self._procs[1:]] if self.nanny else []

    def close(self, timeout: float = 10.0) -> None:
        """Stop every worker and the scheduler; no process is left behind."""
        if self.status == "closed":
            return
        if self.status == "running":
            self._close_elastic()  # no adapt loop may start workers while we stop them
        self.status = "closed"
        if self._control_loop is not None:
            self._control_loop.stop()
        if self._runner is not None:

            async def stop() -> None:
                for w in self._workers:
                    await w.close()
                if self._scheduler is not None:
                    await self._scheduler.close()

            try:
                self._runner.run_sync(stop(), timeout)
            finally:
                self._runner.stop()
        workers, scheduler = self._procs[1:], self._procs[:1]
        _terminate(workers, timeout)  # workers first, so none reports a lost scheduler
        _terminate(scheduler, timeout)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Walltime:
    """LocalCluster's lifetime and task budget options, checked, for its workers."""

    def __init__(
        self, lifetime: float | None, stagger: float, restart: bool, max_tasks: int | None
    ):
        self.lifetime = lifetime  # seconds; None: none
        self.stagger = stagger
        self.restart = restart
        self.max_tasks = max_tasks  # None: none

    def cli_args(self) -> list[str]:
        return [
            *(["--lifetime", repr(self.lifetime)] if self.lifetime is not None else []),
            *(["--lifetime-stagger", repr(self.stagger)] if self.stagger else []),
            *(["--lifetime-restart"] if self.restart else []),
            *(["--max-tasks", str(self.max_tasks)] if self.max_tasks is not None else []),
        ]

    def worker_kwargs(self) -> dict[str, Any]:
        return {
            "lifetime": self.lifetime,
            "lifetime_stagger": self.stagger,
            "lifetime_restart": self.restart,
            "max_tasks": self.max_tasks,
        }


def _walltime(
    lifetime: Any, stagger: Any, restart: bool | None, max_tasks: Any, nanny: bool
) -> _Walltime:
    from shoal._durations import parse_duration, parse_task_budget

    seconds = None if lifetime is None else parse_duration(lifetime, "lifetime")
    spread = parse_duration(stagger, "lifetime_stagger", allow_zero=True)
    budget = None if max_tasks is None else parse_task_budget(max_tasks, "max_tasks")
    if restart is None:
        restart = nanny  # restarted where a nanny can, by default
    elif restart not in (True, False):
        raise TypeError(f"lifetime_restart must be True, False or None, not {restart!r}")
    if restart and not nanny:
        raise ValueError(
            "lifetime_restart=True needs workers under a nanny (processes=True, nanny=True)"
        )
    return _Walltime(seconds, spread, restart, budget)


def _cluster_security(security: Security | None, token: str | bool | None) -> Security:
    """``security`` (default: from the environment) with the token chosen by ``token``:
    None keeps its token or generates one, False means none, a string is the token."""
    base = Security.from_env() if security is None else security
    if token is False:
        return base.with_token(None)
    if token is None or token is True:
        return base if base.token else base.with_token(generate_token())
    if not isinstance(token, str):
        raise TypeError(f"token must be a string, None or False, not {type(token).__name__}")
    return base.with_token(token)


def security_of_local_cluster(address: str) -> Security | None:
    """The security of a running LocalCluster of this process at ``address``."""
    for cluster in list(_live):
        if cluster.scheduler_address == address and cluster.status != "closed":
            return cluster.security
    return None


def _format_resources(resources: Mapping[str, float]) -> str:
    """For ``shoal worker --resources`` (see ``shoal.cli.parse_resources``)."""
    return ",".join(f"{name}={amount!r}" for name, amount in resources.items())


def _terminate(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for child in _children(p.pid):
                child.kill()
            p.kill()
            p.wait()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _in_thread(fn: Any) -> Any:
    """Run ``fn`` in a helper thread: the caller may itself be inside an event loop."""
    return ThreadCall(fn, "shoal-local-call").result()


@atexit.register
def _close_all() -> None:
    clients = sys.modules.get("shoal.client.client")
    if clients is not None:  # clients first: their cluster closing is no lost scheduler
        clients.close_live_clients()
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.close(timeout=3)
