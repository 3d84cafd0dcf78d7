"""The nanny: a process that runs one worker as its child and restarts it when it dies.

- The worker is ``python -m shoal worker ... --no-nanny``, started with this process's
  pid to watch (it exits if the nanny is gone: no orphan survives a SIGKILLed nanny) and
  a local directory owned by the nanny, emptied after every exit (spill files).
- An abnormal exit (a signal, a nonzero code, or a kill for memory) is reported to the
  scheduler (``WorkerExited`` over the nanny's own connection, Hello role "nanny") and
  the worker is started again under the same name, after a backoff; past
  ``max_restarts`` within ``restart_window`` seconds of deaths before joining the
  scheduler (a crash loop at startup) the nanny gives up and exits 1. A worker that had
  joined starts the count afresh: a task that keeps killing workers is the scheduler's
  to stop (KilledWorker), and a nanny that gave up would leave the cluster short.
- A worker that exits with ``EXIT_RESTART`` left the scheduler on purpose (SIGTERM to
  the worker: it handed off its results first) and wants a fresh process: it is
  started again at once under the same name, reported (``WorkerExited``, restarting,
  with the reason it wrote to its restart file), and not counted as a crash.
- A normal exit (the worker lost its scheduler, or was told to close) ends the nanny too.
- Past ``terminate * memory_limit`` of process memory the worker is reported
  ("killed for memory: ...", before the kill, so that the scheduler knows why when
  its connection drops), gets SIGINT (close at once: a worker short of memory hands
  nothing off, and its tasks count it as a death), then SIGKILL after ``kill_grace``
  seconds if it is still there; then it is restarted (and reported again, with how
  it ended).
- SIGTERM or SIGINT to the nanny ends both: the worker gets SIGINT, and SIGKILL if it
  is still there after ``stop_grace`` seconds (its running tasks' threads may take
  that long); the nanny then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence

import psutil

from shoal.comm.connection import CommClosedError, Connection
from shoal.comm.security import Security
from shoal.comm.tcp import HandshakeError, connect
from shoal.plugins.nanny import NannyPlugins
from shoal.protocol import messages as m
from shoal.protocol.exit_codes import EXIT_RESTART
from shoal.protocol.framing import Frame

logger = logging.getLogger("shoal.nanny")

POLL_INTERVAL = 0.1  # seconds between looks at the worker's exit and memory
STOP_GRACE = 8.0  # a worker told to stop may finish its running tasks' threads (5 s)
REPORT_WAIT = 1.0  # seconds a kill for memory waits for the scheduler to have the report
STOP_SIGNAL = signal.SIGINT  # to the worker: close at once (SIGTERM would hand off first)


class SchedulerUnreachable(OSError):
    """No scheduler answered at the address within the timeout."""


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class Nanny:
    def __init__(
        self,
        scheduler_address: str,
        name: str,
        worker_args: Sequence[str] = (),
        memory_limit: int | None = None,
        terminate_fraction: float | None = 0.95,
        local_directory: str | None = None,
        kill_grace: float = 2.0,
        max_restarts: int = 5,
        restart_window: float = 60.0,
        timeout: float = 60.0,
        security: Security | None = None,
        stop_grace: float = STOP_GRACE,
    ):
        self.security = security or Security()  # the worker gets it through its environment
        self.scheduler_address = scheduler_address
        self.name = name
        self.worker_args = list(worker_args)  # options for `shoal worker`, passed through
        self.memory_limit = memory_limit
        self.terminate_fraction = terminate_fraction
        self.kill_grace = kill_grace
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.timeout = timeout
        self.stop_grace = stop_grace
        self.directory = tempfile.mkdtemp(
            prefix=f"shoal-nanny-{name}-", dir=local_directory or tempfile.gettempdir()
        )
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._scheduler: Connection | None = None
        self._stopping = asyncio.Event()
        self._memory_killed = ""  # why we killed the current worker, if we did
        self.plugins = NannyPlugins(self)  # shoal/plugins/nanny.py

    # ---------------------------------------------------------------- the loop

    async def run(self) -> int:
        """Supervise the worker until it exits normally or we are stopped; the exit code."""
        recent: deque[float] = deque()  # restart times within the window
        try:
            await self._connect()
            while True:
                await self.plugins.settled()  # every worker starts in what they prepared
                await self._start_worker()
                code = await self._watch()
                address = self._read_address()
                wanted = self._read_file(self._restart_file) if code == EXIT_RESTART else ""
                self._clean_directory()
                reason = self._memory_killed or describe_exit(code)
                if self._stopping.is_set():
                    return 0
                if code == EXIT_RESTART and address and not self._memory_killed:
                    # It left the scheduler on purpose and asks for a fresh process.
                    reason = f"restarting as it asked: {wanted or 'no reason given'}"
                    logger.info("worker %s (%s) %s", self.name, address, reason)
                    self._report(address, reason, True)
                    recent.clear()
                    self.restarts += 1
                    continue
                if code == 0 and not self._memory_killed:
                    logger.info("worker %s exited normally; the nanny exits too", self.name)
                    return 0
                now = time.monotonic()
                while recent and now - recent[0] > self.restart_window:
                    recent.popleft()
                if address:  # it had joined: not a crash loop at startup, start afresh
                    recent.clear()
                restarting = len(recent) < self.max_restarts
                logger.warning(
                    "worker %s (%s) %s; %s",
                    self.name,
                    address,
                    reason,
                    "restarting" if restarting else "too many restarts: giving up",
                )
                self._report(address, reason, restarting)
                if not restarting:
                    return 1
                # no wait for the first restart in a window, then 0.5 s, 1 s, 2 s...
                backoff = 0.0 if not recent else min(10.0, 0.5 * 2 ** (len(recent) - 1))
                recent.append(now)
                self.restarts += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
                if self._stopping.is_set():
                    return 0
        finally:
            await self._stop_worker()
            await self.plugins.teardown_all()
            self._clean_directory()
            shutil.rmtree(self.directory, ignore_errors=True)
            if self._scheduler is not None:
                self._scheduler.close()

    def restart_worker(self, reason: str) -> None:
        """Restart the running worker gracefully: SIGTERM makes it hand its results off
        and exit asking for a fresh process, which ``run`` starts."""
        proc = self.process
        if proc is not None and proc.returncode is None and not self._stopping.is_set():
            logger.info("restarting worker %s: %s", self.name, reason)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Stop the worker (SIGTERM, SIGKILL after a grace period) and exit."""
        self._stopping.set()

    # ---------------------------------------------------------------- the worker

    async def _start_worker(self) -> None:
        self._memory_killed = ""
        self._address_file = os.path.join(self.directory, "address")
        self._restart_file = os.path.join(self.directory, "restart-reason")
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._address_file)  # the last worker's: this one writes its own
        cmd = [
            sys.executable,
            "-m",
            "shoal",
            "worker",
            self.scheduler_address,
            *self.worker_args,
            "--no-nanny",
            "--name",
            self.name,
            "--local-directory",
            self.directory,
            "--watch-pid",
            str(os.getpid()),
            "--address-file",
            self._address_file,
            "--restart-file",
            self._restart_file,
            "--timeout",
            str(self.timeout),
        ]
        cmd += ["--memory-limit", "none" if self.memory_limit is None else str(self.memory_limit)]
        env = {**os.environ, **self.security.to_env()}  # never on the command line
        self.process = await asyncio.create_subprocess_exec(*cmd, stdin=subprocess.DEVNULL, env=env)
        logger.info("started worker %s (pid %d)", self.name, self.process.pid)

    async def _watch(self) -> int:
        """Wait for the worker to exit, killing it if it uses too much memory."""
        proc = self.process
        assert proc is not None
        limit = None
        if self.memory_limit and self.terminate_fraction:
            limit = int(self.terminate_fraction * self.memory_limit)
        ps = psutil.Process(proc.pid)
        killing: asyncio.Task[None] | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                code = await asyncio.wait_for(proc.wait(), POLL_INTERVAL)
                if killing is not None:
                    await killing
                return code
            if killing is not None:
                continue
            if self._stopping.is_set():
                killing = asyncio.ensure_future(self._kill(proc, self.stop_grace))
                continue
            if limit is None:
                continue
            try:
                rss = ps.memory_info().rss
            except psutil.Error:
                continue  # exiting: wait() says so next
            if rss > limit:
                self._memory_killed = (
                    f"killed for memory: {rss // 10**6} MB, over the terminate threshold "
                    f"({limit // 10**6} MB)"
                )
                logger.warning("worker %s %s", self.name, self._memory_killed)
                killing = asyncio.ensure_future(self._kill_for_memory(proc))

    async def _kill_for_memory(self, proc: asyncio.subprocess.Process) -> None:
        """Tell the scheduler why first, and wait (a moment at most) until it has read
        it: the worker's connection drops as it dies, and the scheduler must know by
        then, so that a KilledWorker it raises says it was memory."""
        conn, address = self._scheduler, self._read_address()
        if conn is not None and not conn.closed and address:
            self._report(address, self._memory_killed, True)
            with contextlib.suppress(TimeoutError, CommClosedError):
                await conn.request(lambda rid: m.Heartbeat(rid), timeout=REPORT_WAIT)
        await self._kill(proc, self.kill_grace)

    async def _kill(self, proc: asyncio.subprocess.Process, grace: float) -> None:
        """SIGINT (close at once), then SIGKILL if the worker is still there after
        ``grace`` seconds."""
        if proc.returncode is not None:
            return
        if not self._read_address():
            # Still starting (not connected): nothing to close or hand off, and SIGINT
            # would interrupt its imports with a KeyboardInterrupt traceback.
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return
        name = STOP_SIGNAL.name
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(STOP_SIGNAL)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            logger.warning("worker %s ignored %s for %.1fs: SIGKILL", self.name, name, grace)
            if self._memory_killed:
                self._memory_killed += f"; it ignored {name} for {grace:g}s: SIGKILL"
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def _stop_worker(self) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            await self._kill(proc, self.stop_grace)

    def _read_address(self) -> str:
        return self._read_file(self._address_file)  # none: it died before it connected

    @staticmethod
    def _read_file(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    def _clean_directory(self) -> None:
        """Remove what the last worker left in its directory (its spill files)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    # ---------------------------------------------------------------- the scheduler

    async def _connect(self) -> None:
        hello = m.Hello(m.PROTOCOL_VERSION, "nanny", name=self.name, pid=os.getpid())
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                self._scheduler, _ = await connect(
                    self.scheduler_address, hello, security=self.security
                )
                break
            except HandshakeError as e:  # reports are a courtesy: supervise without them
                logger.warning("the scheduler refused the nanny (%s): no exit reports", e)
                return
            except OSError as e:  # the scheduler may not be listening yet
                if time.monotonic() > deadline:
                    raise SchedulerUnreachable(
                        f"no scheduler at {self.scheduler_address} within {self.timeout:g}s "
                        f"(--timeout): {e}"
                    ) from None
                await asyncio.sleep(0.2)
        self._scheduler.set_handler(self._on_scheduler_frame)
        self._scheduler.on_close = self._scheduler_lost

    def _on_scheduler_frame(self, conn: Connection, frame: Frame) -> None:
        for msg in frame.messages:
            if type(msg) is m.RegisterPlugin or type(msg) is m.UnregisterPlugin:
                self.plugins.on_message(msg)
            else:
                logger.debug("nanny %s ignores %s", self.name, msg)

    def _scheduler_lost(self, conn: Connection, exc: BaseException | None) -> None:
        if not self._stopping.is_set():
            logger.info("nanny %s lost the scheduler (%s); stopping", self.name, conn.close_reason)
            self.stop()

    def _report(self, address: str, reason: str, restarting: bool) -> None:
        conn = self._scheduler
        if conn is None:
            return
        msg = m.WorkerExited(
            address, self.name, reason, restarting, stimulus_id=f"worker-exited-{time.time()}"
        )
        with contextlib.suppress(CommClosedError):
            conn.send(msg)
