"""The worker process: runs tasks in a thread pool, serves its data to peers.

Decisions belong to :class:`~shoal.core.worker.state.WorkerState`; this shell turns
messages and thread results into events, and carries out the instructions: run a
task on a thread, fetch data from a peer, send a message to the scheduler.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import psutil

from shoal.client.loop import in_thread
from shoal.comm.addresses import WorkerAddressOptions
from shoal.comm.buffer_pool import configure_process_pool
from shoal.comm.connection import Connection
from shoal.comm.heartbeat import keep_alive
from shoal.comm.pool import ConnectionPool
from shoal.comm.same_host import DataLeases
from shoal.comm.security import Security
from shoal.comm.tcp import connect, listen, parse_address
from shoal.comm.traffic import Traffic
from shoal.core.scheduler.membership import DEFAULT_SCHEDULER_TIMEOUT
from shoal.core.worker.release import DEFAULT_INTERRUPT_GRACE
from shoal.core.worker.state import (
    Execute,
    ExecuteSuccess,
    GatherDep,
    Interrupt,
    InterruptExpired,
    Pause,
    RestartWorker,
    ResumeThread,
    SendMessage,
    Unpause,
    UnserializableData,
    WorkerState,
)
from shoal.lanes._worker import WorkerLanes
from shoal.plugins.worker import WorkerPlugins
from shoal.protocol import messages as m
from shoal.protocol.framing import Frame, ProtocolError
from shoal.protocol.messages import check_resources
from shoal.protocol.serialize import (
    FunctionCache,
    loads_task_args,
)
from shoal.server.actors import ActorServer
from shoal.server.inline_results import InlineResults
from shoal.server.interrupt import TaskThreads
from shoal.server.lifetime import Lifetime, check_budget, end_of_life, refuse
from shoal.server.loop_latency import LoopLatency
from shoal.server.loop_tasks import loop_safe_function, runs_on_loop, tiny_tasks_on_loop_enabled
from shoal.server.memory import MONITOR_INTERVAL, MemoryFractions, MemoryMonitor, process_memory
from shoal.server.output import OUTPUT_INTERVAL, OutputCollector
from shoal.server.output import install as install_output_capture
from shoal.server.scheduler import tune_gc
from shoal.server.spill import SpillBuffer
from shoal.server.task_thread import TaskThreadMixin
from shoal.server.task_thread import current_task as current_task
from shoal.server.telemetry import Telemetry
from shoal.server.transfers import TransferTotals
from shoal.server.worker_transfer import DESERIALISE_LOCK, WorkerTransferMixin
from shoal.server.worker_transfer import GATHER_TIMEOUT as GATHER_TIMEOUT
from shoal.shuffle._worker import ShuffleService

logger = logging.getLogger("shoal.worker")

# How long a leaving worker waits for the scheduler to let it go (its results copied
# off) before it closes anyway: what is not copied by then is recomputed.
LEAVE_TIMEOUT = 30.0

_SCHEDULER_EVENTS = (m.ComputeTask, m.FreeKeys, m.ReleaseCompute, m.CopyKeys, m.StealRequest)
_TAKE_BACK = (m.FreeKeys, m.ReleaseCompute, m.ComputeTask)  # these drop a deferred ComputeTask


class Worker(TaskThreadMixin, WorkerTransferMixin):
    def __init__(
        self,
        scheduler_address: str,
        nthreads: int = 1,
        name: str = "",
        host: str | None = None,  # None: the route to the scheduler (comm/addresses.py)
        port: int = 0,
        memory_limit: int | None = None,
        zero: bool = False,
        validate: bool = False,
        owns_process: bool = False,
        resources: Mapping[str, float] | None = None,
        scheduler_timeout: float = DEFAULT_SCHEDULER_TIMEOUT,
        security: Security | None = None,
        memory_fractions: MemoryFractions | None = None,
        local_directory: str | None = None,
        under_nanny: bool = False,
        interrupt_grace: float = DEFAULT_INTERRUPT_GRACE,
        lifetime: float | None = None,
        lifetime_stagger: float = 0.0,
        lifetime_restart: bool = False,
        max_tasks: int | None = None,
        interface: str | None = None,
        listen_address: str | None = None,
        contact_address: str | None = None,
        dashboard_address: str | None = None,
        metrics_address: str | None = None,
        metrics_token: str | None = None,
    ):
        if nthreads < 1:
            raise ValueError(f"nthreads must be at least 1, not {nthreads}")
        self.resources = check_resources(resources or {})  # e.g. {"GPU": 2}: tasks may ask
        self.scheduler_address = scheduler_address
        self.nthreads = nthreads
        self.name = name
        self.addresses = WorkerAddressOptions(
            host, port, interface, listen_address, contact_address
        ).check()
        self.memory_limit = psutil.virtual_memory().total if memory_limit is None else memory_limit
        self.memory_fractions = MemoryFractions() if memory_fractions is None else memory_fractions
        self._telemetry: Telemetry | None = None  # CPU and network, for heartbeats
        self.zero = zero  # report every task done at once: measures scheduler overhead
        self.validate = validate
        self.owns_process = owns_process  # the CLI's worker may tune process-wide settings
        self.scheduler_timeout = scheduler_timeout
        self.close_reason = ""  # why it closed: "retired", "lost the scheduler: ...", ...
        self.under_nanny = under_nanny  # a nanny starts a new process if it exits to restart
        self.interrupt_grace = interrupt_grace  # then a stuck interrupted thread restarts us
        # --lifetime / --max-tasks: leave when time is up or the budget spent (lifetime.py)
        self.lifetime = Lifetime(lifetime, lifetime_stagger, lifetime_restart, max_tasks)
        self._task_threads = TaskThreads()  # which thread runs which task (to interrupt it)
        self._stuck: set[Any] = set()  # tasks whose threads did not stop when interrupted
        self.leaving = ""  # why it told the scheduler it leaves (WorkerLeaving), if it did
        self.restart = False  # the process should exit with EXIT_RESTART (its nanny restarts it)
        self.address = ""
        self.id = f"worker-{uuid.uuid4().hex[:12]}"
        # HTTP (shoal/dashboard/serve_metrics.py): its own port with /metrics and
        # /health ("host:port", ":0": any free port; None: none), a /metrics-only site.
        self.dashboard_address = dashboard_address
        self.metrics_address = metrics_address
        self.metrics_token = metrics_token
        self.http_address = ""  # the URL of its own port, once open
        self._http_sites: list[Any] = []
        self.traffic = Traffic()  # what its connections carried (shoal/comm/traffic.py)
        self.transfers = TransferTotals()  # dependency bytes fetched and served
        self.leases = DataLeases()  # buffers lent to askers on this host (same_host)
        self.loop_latency = LoopLatency()
        # Spill files go here; removed on close (and by the nanny, should we die).
        self.local_directory = os.path.join(local_directory or tempfile.gettempdir(), self.id)
        self._spill: SpillBuffer | None = None
        self._memory: MemoryMonitor | None = None
        self.state: WorkerState | None = None
        self.functions = FunctionCache()
        self._loaded_functions: dict[str, Any] = {}  # read without the lock once loaded
        self.scheduler: Connection | None = None
        self._server: asyncio.Server | None = None
        self.security = security or Security()  # token / TLS for every connection
        self._peers = ConnectionPool(
            lambda: m.Hello(m.PROTOCOL_VERSION, "peer", name=self.address),
            security=self.security,
            traffic=self.traffic,
        )
        # batches of tasks to run: (key, function id, arguments, the mark
        # TaskThreads.queued gave it); None: end
        self._queue: queue.SimpleQueue[list[tuple[Any, str, m.Payload, list[bool]]] | None] = (
            queue.SimpleQueue()
        )
        self._inline_results = InlineResults()  # small results of wanted keys: inline
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()  # seceding tasks add threads
        self._thread_numbers = itertools.count()
        self._rejoins: dict[Any, threading.Event] = {}  # key -> its thread waiting to rejoin
        self._client: Any = None  # the Client of tasks here (get_client), made once needed
        self._client_lock = threading.Lock()
        self._results: list[Any] = []
        self._results_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()
        self._close_done = asyncio.Event()  # close() has finished (threads joined, files gone)
        self._stimulus = itertools.count(1)
        self.shuffle = ShuffleService(self, DESERIALISE_LOCK)  # P2P shuffles' data here
        self.actors = ActorServer(self)  # calls to the actors this worker holds
        # Shuffle tasks sent again while an execution of an older run still runs here:
        # fed in once it has ended, so that its result never answers the new run.
        self._deferred: dict[Any, m.ComputeTask] = {}
        self.plugins = WorkerPlugins(self)  # shoal/plugins/worker.py
        self.lanes = WorkerLanes(self)  # clients' one-task gets sent here (shoal/lanes)
        self._output: OutputCollector | None = None  # task output (shoal/server/output.py)
        # Tiny tasks run on the loop (shoal/server/loop_tasks.py): their results, fed to
        # the state machine once the instructions that started them are carried out.
        self.tiny_tasks_on_loop = tiny_tasks_on_loop_enabled()
        self.loop_task_count = 0  # tasks run on the loop so far
        self._loop_results: list[Any] = []
        self._feeding_loop_results = False

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> Worker:
        if self.owns_process:
            tune_gc()
            Connection.fatal_on_invalid_state = self.validate
        self._loop = asyncio.get_running_loop()
        configure_process_pool(self.memory_limit)  # before the first connection
        self.lifetime.start(time.monotonic())
        listen_host, listen_port = self.addresses.listen_on(self.scheduler_address)
        self._server, listening = await listen(
            listen_host, listen_port, self._accept_peer, self.security, traffic=self.traffic
        )
        self.address = self.addresses.advertise(listening, self.scheduler_address)
        self.loop_latency.start()
        if self.dashboard_address is not None or self.metrics_address is not None:
            from shoal.dashboard.serve_metrics import open_worker_http  # aiohttp: only now

            host = parse_address(self.address)[0]
            self._http_sites, self.http_address = await open_worker_http(self, host)
        target, spill, pause, _ = self.memory_fractions  # terminating is the nanny's
        if target is not None or spill is not None:
            self._spill = SpillBuffer(
                os.path.join(self.local_directory, "spill"),
                target=None if target is None else int(target * self.memory_limit),
                on_unserializable=self._unserializable,
            )
        self.state = WorkerState(
            self.nthreads,
            self.address,
            validate=self.validate,
            resources=self.resources,
            data=self._spill,
            memory_limit=self.memory_limit,
        )
        hello = m.Hello(
            m.PROTOCOL_VERSION,
            "worker",
            name=self.name,
            address=self.address,
            nthreads=self.nthreads,
            memory_limit=self.memory_limit,
            pid=os.getpid(),
            resources=self.resources,
            lifetime=self.lifetime.remaining(time.monotonic()),
            max_tasks=self.lifetime.max_tasks,
            http_address=self.http_address,
        )
        self.scheduler, welcome = await connect(
            self.scheduler_address, hello, security=self.security, traffic=self.traffic
        )
        self.name = welcome.assigned
        left = self.lifetime.remaining(time.monotonic())
        if left is not None:
            self._loop.call_later(left, self._end_of_life, "its lifetime is over")
        self.scheduler.on_close = self._scheduler_lost
        self.scheduler.set_handler(self._on_scheduler_frame)
        if self.owns_process:  # (an in-process worker's tasks write to the process's streams)
            self._output = install_output_capture()
            self._spawn(self._forward_output())
        for _ in range(self.nthreads):
            self._start_thread()
        # A scheduler that stops answering is gone, as one that closed the connection.
        beats = keep_alive(self.scheduler, self._heartbeat_message, self.scheduler_timeout, 0.5)
        self._spawn(beats)
        if spill is not None or pause is not None:
            self._memory = MemoryMonitor(
                self.memory_limit, self.memory_fractions, self._spill, self._set_paused
            )
            self._spawn(self._monitor_memory())
        logger.info("worker %s connected to %s", self.address, self.scheduler_address)
        return self

    async def close(self, reason: str = "closed") -> None:
        if self._closed.is_set():
            return
        self.close_reason = self.close_reason or reason
        self._closed.set()
        await self.plugins.teardown_all()  # while the scheduler can still hear of failures
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:  # first: tasks waiting on its futures end
            await in_thread(client.close)  # at exit too
        with self._threads_lock:
            threads = list(self._threads)
            for event in self._rejoins.values():  # let waiting threads end their tasks
                event.set()
        self.shuffle.close()  # shuffle tasks that wait end
        self.actors.close()
        self.lanes.close()
        for _ in threads:
            self._queue.put(None)
        if self._server is not None:
            self._server.close()
        self.loop_latency.stop()
        for site in self._http_sites:
            await site.close()
        if self.scheduler is not None:
            self.scheduler.close()
        self._peers.close()
        for task in list(self._background):
            if task is not asyncio.current_task():  # close itself may run in one
                task.cancel()
        # Polled, not joined in a thread: at interpreter exit (a cluster closed by
        # atexit) no executor takes new work, and the close would fail half done.
        deadline = time.monotonic() + 5
        for t in threads:
            while t.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        if self._spill is not None:
            self._spill.close()
        shutil.rmtree(self.local_directory, ignore_errors=True)
        self._close_done.set()

    def add_plugin(self, plugin: Any, name: str | None = None) -> Any:
        """Register a worker plugin from this process (a ``--preload`` module) and run
        its ``setup``: what it raised, or None (an awaitable of that if async)."""
        return self.plugins.add(plugin, name)

    async def finished(self) -> None:
        """Wait until the worker is closed, and done closing."""
        await self._closed.wait()
        await self._close_done.wait()

    async def leave(
        self,
        reason: str,
        retire: bool = True,
        restart: bool = False,
        timeout: float | None = None,
        walltime: bool = False,
    ) -> None:
        """Go away on purpose: tell the scheduler (``WorkerLeaving``), which moves the
        running tasks elsewhere and, with ``retire``, copies the results only this
        worker holds to others; it then answers ``CloseWorker`` and this worker closes
        (or closes anyway after ``timeout``, LEAVE_TIMEOUT by default). Nothing counts
        as a failure. ``restart``: the process then exits with ``EXIT_RESTART``, for
        its nanny to start a fresh one under the same name (see ``under_nanny``)."""
        self.restart = self.restart or restart
        if self._closed.is_set() or self.leaving:
            return
        self.leaving = reason
        conn = self.scheduler
        if conn is not None and not conn.closed:
            logger.info("worker %s leaves: %s", self.address, reason)
            sid = f"worker-leaving-{next(self._stimulus)}"
            conn.send(m.WorkerLeaving(reason, retire, sid, walltime))
            wait = LEAVE_TIMEOUT if timeout is None else timeout
            try:
                await asyncio.wait_for(self._closed.wait(), wait)
            except TimeoutError:
                logger.warning("the scheduler did not let %s go within %gs", self.address, wait)
        await self.close(f"left: {reason}")

    def on_sigterm(self) -> None:
        """SIGTERM (preemption, a resilience test): leave gracefully, handing off the
        results only this worker holds; under a nanny, to be restarted afresh."""
        if not self._closed.is_set():
            self._spawn(self.leave("received SIGTERM", retire=True, restart=self.under_nanny))
            # (close() cancels the other background tasks, never the one it runs in)

    def _end_of_life(self, reason: str) -> None:
        """Time is up or the task budget spent: leave gracefully (lifetime.py)."""
        end_of_life(self, reason)

    def _scheduler_lost(self, conn: Connection, exc: BaseException | None) -> None:
        if not self._closed.is_set():
            logger.info("lost the scheduler (%s); closing", conn.close_reason)
            self._spawn(self.close(f"lost the scheduler: {conn.close_reason}"))

    def _heartbeat_message(self, request_id: int) -> m.Message:
        assert self.state is not None
        memory, spilled = self.memory_metrics()
        if self._telemetry is None:
            self._telemetry = Telemetry()
        cpu, net_in, net_out = self._telemetry.sample()
        _, _, pause, terminate = self.memory_fractions
        return m.Heartbeat(
            request_id,
            memory,
            spilled,
            self.state.executing_count,
            transferred_in=self.transfers.incoming_bytes,
            transferred_out=self.transfers.outgoing_bytes,
            cpu=cpu,
            net_in=net_in,
            net_out=net_out,
            memory_pause=pause,
            memory_terminate=terminate,
        )

    @property
    def spill_buffer(self) -> SpillBuffer | None:
        """Where results are kept when they may spill (None: a plain dict)."""
        return self._spill

    def memory_metrics(self) -> tuple[int, int]:
        """(process memory, bytes of spilled results on disk), for heartbeats."""
        rss = self._memory.rss if self._memory is not None else process_memory()
        return rss, self._spill.spilled_bytes if self._spill is not None else 0

    async def _monitor_memory(self) -> None:
        assert self._memory is not None
        while not self._closed.is_set():
            await asyncio.sleep(MONITOR_INTERVAL)
            self._memory.check()

    def _set_paused(self, paused: bool) -> None:
        sid = f"memory-{next(self._stimulus)}"
        self._handle([Pause(sid) if paused else Unpause(sid)])

    def _unserializable(self, key: Any, reason: str) -> None:
        """The SpillBuffer could not pickle a result: from any thread, and maybe from
        inside ``_handle`` itself, so the event is handled on a later loop iteration."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._report_unserializable, [(key, reason)])

    def _report_unserializable(self, failed: list[tuple[Any, str]]) -> None:
        if not self._closed.is_set():
            sid = f"unserializable-{next(self._stimulus)}"
            self._handle([UnserializableData(key, reason, sid) for key, reason in failed])

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---------------------------------------------------------------- events and instructions

    def _on_scheduler_frame(self, conn: Connection, frame: Frame) -> None:
        events: list[Any] = []
        lifetime, wanted = self.lifetime, self._inline_results
        for msg in frame.messages:
            if type(msg) is m.ComputeTask:  # most messages: tested first, once
                if not lifetime.accept():
                    refuse(self, msg)
                elif msg.shuffle is not None:
                    self.shuffle.on_compute(msg)
                    if events:  # e.g. the ReleaseCompute of its older run's execution
                        self._handle(events)
                        events = []
                    self._compute_shuffle_task(msg)
                else:
                    wanted.note(msg)
                    if self._deferred:
                        self._undefer(msg)
                    events.append(msg)
            elif type(msg) is m.FunctionDefs:
                self.functions.add(msg.functions)
            elif type(msg) in _SCHEDULER_EVENTS:
                wanted.note(msg)
                if self._deferred and type(msg) in _TAKE_BACK:
                    self._undefer(msg)
                events.append(msg)
            elif type(msg) is m.ShuffleRestart:
                self.shuffle.on_restart(msg.id, msg.run)
            elif type(msg) is m.ShuffleForget:
                self.shuffle.on_forget(msg.id, msg.run)
            elif type(msg) is m.RegisterPlugin or type(msg) is m.UnregisterPlugin:
                if events:  # in order: a plugin set up here sees the tasks after it
                    self._handle(events)
                    events = []
                self.plugins.on_message(msg)
            elif (
                type(msg) is m.LaneOpen
                or type(msg) is m.LaneClosed
                or type(msg) is m.LaneDurations
            ):
                self.lanes.on_scheduler(msg)
            elif type(msg) is m.CloseWorker:
                logger.info("the scheduler closes this worker: %s", msg.reason)
                self.close_reason = msg.reason
                self._spawn(self.close(msg.reason))
            else:
                raise ProtocolError(f"the scheduler may not send {type(msg).__name__}")
        if events:
            self._handle(events)
        if self.lifetime.budget_spent:
            check_budget(self)

    def _compute_shuffle_task(self, msg: m.ComputeTask) -> None:
        assert self.state is not None
        ts = self.state.tasks.get(msg.key)
        if ts is not None and ts.state == "cancelled":
            self._deferred[msg.key] = msg  # until that execution ends
        else:
            self._handle([msg])

    def _undefer(self, msg: m.Message) -> None:
        """The scheduler takes back a task whose ComputeTask waits here: drop that."""
        keys = msg.keys if type(msg) is m.FreeKeys else [msg.key]  # type: ignore[attr-defined]
        for key in keys:
            self._deferred.pop(key, None)

    def _resume_deferred(self) -> None:
        assert self.state is not None
        for key, msg in list(self._deferred.items()):
            ts = self.state.tasks.get(key)
            if ts is None or ts.state != "cancelled":
                del self._deferred[key]
                self._handle([msg])

    def _handle(self, events: list[Any]) -> None:
        assert self.state is not None
        instructions = self.state.handle(*events)
        send = self.scheduler.send if self.scheduler is not None else None
        starts: list[Any] = []  # keys to run, handed to the threads together
        for inst in instructions:
            if type(inst) is SendMessage:
                if send is not None:
                    send(inst.msg)
                continue
            if type(inst) is Execute:
                starts.append(inst.key)
                continue
            if starts:  # in order: an Interrupt must find a task queued before it
                self._execute(starts)
                starts = []
            if isinstance(inst, GatherDep):
                self._spawn(self._gather(inst))
            elif isinstance(inst, ResumeThread):
                with self._threads_lock:
                    event = self._rejoins.pop(inst.key, None)
                if event is not None:
                    event.set()
            elif isinstance(inst, Interrupt):
                self._interrupt(inst)
            elif isinstance(inst, RestartWorker):
                self._restart_stuck(inst)
            else:  # pragma: no cover - a new instruction the shell does not know
                raise TypeError(f"unknown instruction {inst!r}")
        if starts:
            self._execute(starts)
        if self._deferred:
            self._resume_deferred()
        if self.plugins.watching:
            self.plugins.flush_transitions()
        if self._loop_results and not self._feeding_loop_results:
            self._feed_loop_results()

    def _feed_loop_results(self) -> None:
        """The results of tasks run on the loop, into the state machine (as a thread's
        would come, after the instructions that started them); their dependents run on
        the loop in turn are fed by this same loop, not by recursion."""
        self._feeding_loop_results = True
        try:
            while self._loop_results:
                events, self._loop_results = self._loop_results, []
                if self._closed.is_set():
                    continue
                self._handle(events)
                if self.lifetime.budget_spent:
                    check_budget(self)
        finally:
            self._feeding_loop_results = False
        if self.scheduler is not None:  # results go now, as a thread's (_drain_results)
            self.scheduler.flush()

    def _execute(self, keys: list[Any]) -> None:
        """Hand ``keys`` (best first) to the task threads. A single thread gets them as
        one batch: it is woken once per batch, not once per task (each wake-up costs the
        loop a context switch, and on a busy machine its CPU for a while). With several
        threads each task goes on its own, so that whichever thread is free first takes
        it (a batch would wait behind a long task of its thread)."""
        assert self.state is not None
        tasks = self.state.tasks
        if self.zero:
            for key in keys:
                now = time.time()
                event = ExecuteSuccess(
                    key=key,
                    value=None,
                    nbytes=0,
                    inline=None,
                    type_name="NoneType",
                    start=now,
                    stop=now,
                    stimulus_id=f"zero-{now}",
                )
                self._push_result(event)
            return
        queued = self._task_threads.queued
        # Only a loaded function of LOOP_SAFE_FUNCTIONS may run on the loop: for any
        # other (nearly every task) one dict lookup, no call, decides.
        loaded = self._loaded_functions if self.tiny_tasks_on_loop else None
        items = []
        for key in keys:
            ts = tasks[key]
            run_spec = ts.run_spec
            assert run_spec is not None
            if (
                loaded is not None
                and loop_safe_function(loaded.get(run_spec[0]))
                and self._run_on_loop(key, ts, run_spec)
            ):
                continue
            items.append((key, run_spec[0], run_spec[1], queued(key)))
        if not items:
            return
        if self.nthreads == 1:
            self._queue.put(items)
        else:
            for item in items:
                self._queue.put([item])

    def _run_on_loop(self, key: Any, ts: Any, run_spec: tuple[str, m.Payload]) -> bool:
        """Run ``key`` here and now if it is tiny (shoal/server/loop_tasks.py); False:
        it goes to a thread."""
        assert self.state is not None
        func_id, payload = run_spec
        func = self._loaded_functions.get(func_id)
        if not loop_safe_function(func):
            return False
        data = self.state.data
        resolve = data.__getitem__
        spill = self._spill
        if spill is None:
            in_memory = lambda dts: dts.key in data  # noqa: E731
        else:
            in_memory = lambda dts: spill.in_memory(dts.key)  # noqa: E731
        if not runs_on_loop(
            func,
            payload,
            ts.dependencies,
            in_memory,
            lambda: loads_task_args(payload, resolve, self._function),
        ):
            return False
        self.loop_task_count += 1
        # The very method a task thread runs: the same result, error, traceback and times.
        self._loop_results.append(self._run_one(key, func_id, payload, resolve, []))
        return True

    # ---------------------------------------------------------------- interrupting tasks

    def _interrupt(self, inst: Interrupt) -> None:
        """Raise TaskInterrupted in the thread running ``inst.key``; check on it after
        the grace period."""
        where = self._task_threads.interrupt(inst.key)
        logger.info("interrupting task %r (%s)", inst.key, where or "already over")
        if self._loop is not None:
            self._loop.call_later(self.interrupt_grace, self._interrupt_expired, inst)

    def _interrupt_expired(self, inst: Interrupt) -> None:
        if self._closed.is_set():
            return
        self._drain_results()  # a thread that has just ended says so first
        sid = f"interrupt-expired-{next(self._stimulus)}"
        self._handle([InterruptExpired(inst.key, inst.interrupt_id, sid)])

    def _restart_stuck(self, inst: RestartWorker) -> None:
        """A thread did not return within the grace period after its interrupt: restart
        through the nanny (its results handed off first, nothing counted as a failure);
        without a nanny nothing can stop it: say so (its slot stays counted busy)."""
        if self.under_nanny:
            if not self.leaving and not self._closed.is_set():
                logger.warning(
                    "%s within %gs: restarting this worker", inst.reason, self.interrupt_grace
                )
                self._spawn(self.leave(inst.reason, retire=True, restart=True))
        elif inst.reason not in self._stuck:
            self._stuck.add(inst.reason)
            logger.error(
                "%s within %gs, and this worker has no nanny to restart it: that thread "
                "stays busy (and counted busy by the scheduler) until it returns. Run "
                "workers with a nanny (shoal worker --nanny) to have them restarted.",
                inst.reason,
                self.interrupt_grace,
            )

    def _start_thread(self) -> None:
        with self._threads_lock:
            # seceded threads end with their tasks: forget those, or the list would grow
            self._threads = [t for t in self._threads if t.is_alive()]
            n = next(self._thread_numbers)
            t = threading.Thread(target=self._run_tasks, name=f"shoal-task-{n}", daemon=True)
            t.start()
            self._threads.append(t)

    # ---------------------------------------------------------------- tasks that wait on tasks

    def get_client(self) -> Any:
        """The Client of the tasks of this worker: one, made on first use, closed with
        the worker. It does not subscribe to cluster-state pushes."""
        from shoal.client.client import Client

        with self._client_lock:
            if self._closed.is_set():
                raise RuntimeError(f"worker {self.address} is closed")
            if self._client is None:
                self._client = Client(
                    self.scheduler_address,
                    name=f"worker-{self.name}",
                    set_as_default=False,
                    security=self.security,
                    subscribe=False,
                )
            return self._client

    def _push_result(self, event: Any) -> None:
        with self._results_lock:
            self._results.append(event)
            first = len(self._results) == 1
        if first and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._drain_results)

    def _drain_results(self) -> None:
        with self._results_lock:
            events, self._results = self._results, []
        if self._output is not None and self.scheduler is not None:
            for msg in self._output.take():  # a task's output goes before its result
                self.scheduler.send(msg)
        if events and not self._closed.is_set():
            self._handle(events)
            if self.lifetime.budget_spent:
                check_budget(self)
        if self.scheduler is not None:  # results go now, not one loop iteration later
            self.scheduler.flush()

    async def _forward_output(self) -> None:
        """Send what running tasks wrote, once an interval (batched and bounded)."""
        assert self._output is not None
        while self.scheduler is not None:
            await asyncio.sleep(OUTPUT_INTERVAL)
            for msg in self._output.take(refill=True):
                self.scheduler.send(msg)
