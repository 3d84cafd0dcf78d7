"""Load generators for ``benchmarks/cluster_state.py``: many idle workers or clients in
one process (one event loop), talking to a real scheduler.

    python -m benchmarks.simulated MODE --address ADDR --n N [--first I] --dir DIR --name NAME

Modes:

``shoal-workers``
    Simulated shoal workers speaking the real worker protocol through shoal's own comm
    layer: ``shoal.comm.tcp.connect`` (preamble, ``Hello(role="worker", address=...,
    nthreads=1, memory_limit=..., pid=...)``, ``Welcome``), then
    ``shoal.comm.heartbeat.keep_alive`` with the same ``Heartbeat`` the real worker
    sends, at the interval each ``HeartbeatReply`` gives (as ``shoal/server/worker.py``
    does). The listening address is fake (``tcp://127.0.0.1:<10000 + index>``, unique
    per cluster): nothing connects to an idle worker. What a scheduler sends besides the
    heartbeat replies is counted (an idle worker should get nothing); ``CloseWorker``
    closes the connection, as on a real worker.
``shoal-clients``
    Real ``shoal.Client(address, asynchronous=True)`` with default settings (they
    subscribe to the pushed summary).
``dask-workers``
    Real ``distributed.Worker(address, nthreads=1)`` objects (no nanny, no dashboard).
    Worker-local timers that never message the scheduler are slowed so that hundreds
    of workers fit in one event loop (see ``DASK_WORKER_CONFIG``); the heartbeat and
    everything else the scheduler sees keep their defaults.
``dask-clients``
    Real ``distributed.Client(address, asynchronous=True)`` with default settings.

Progress and readiness go to ``DIR/NAME.json`` (rewritten atomically). On SIGUSR1 the
process writes ``DIR/NAME.counts.json`` with a sequence number (so that the caller knows
the file is fresh) and what it counted so far. shoal modes: bytes and messages (by
type) received from the scheduler, counted by the connections themselves (a subclass of
shoal's ``Connection`` put in place of it in ``shoal.comm.tcp``, in this process only).
Dask modes: requests made to the scheduler (``Worker.heartbeat``,
``Client._update_scheduler_info`` and ``Client._heartbeat`` calls, counted by wrappers
set on those classes in this process only).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import signal
import time
import traceback
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

# Worker-local periodic callbacks of distributed.Worker that send nothing to the
# scheduler: at their defaults (tick every 20 ms, memory monitor every 100 ms, system
# monitor every 500 ms, which lists /proc/self/fd) 250 workers in one loop make ~15,000
# callbacks a second and starve the loop. The heartbeat (whose interval the scheduler
# chooses) and everything else that talks to the scheduler keep their defaults.
DASK_WORKER_CONFIG = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.tick.limit": "60s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "10s",
    "distributed.worker.profile.enabled": False,
}

# Connections being opened at once per process. Up to 8 processes connect at the same
# time, and shoal listens with asyncio's default backlog of 100: at 32 each, a burst of
# connections overflowed the accept queue and a few were reset during the handshake.
CONNECT_CONCURRENCY = 8
FAKE_PORT_BASE = 10000


class Counters:
    def __init__(self) -> None:
        self.recv_bytes = 0
        self.msgs: collections.Counter[str] = collections.Counter()
        self.closed = 0
        self.unexpected: collections.Counter[str] = collections.Counter()


COUNTS = Counters()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class Status:
    def __init__(self, directory: Path, name: str, mode: str, n: int):
        self.path = directory / f"{name}.json"
        self.counts_path = directory / f"{name}.counts.json"
        self.data: dict[str, Any] = {
            "mode": mode,
            "n": n,
            "pid": os.getpid(),
            "started": 0,
            "ready": 0,
            "failed": 0,
            "errors": [],
            "done": False,
        }
        self.seq = 0
        self._last_write = 0.0

    def update(self, force: bool = False, **kw: Any) -> None:
        self.data.update(kw)
        now = time.monotonic()
        if force or now - self._last_write > 0.5:
            self._last_write = now
            _write_json(self.path, self.data)

    def error(self, what: str) -> None:
        self.data["failed"] += 1
        if len(self.data["errors"]) < 5:
            self.data["errors"].append(what)
        self.update(force=True)

    def write_counts(self) -> None:
        self.seq += 1
        _write_json(
            self.counts_path,
            {
                "seq": self.seq,
                "t": time.monotonic(),
                "recv_bytes": COUNTS.recv_bytes,
                "msgs": dict(COUNTS.msgs),
                "closed": COUNTS.closed,
                "unexpected": dict(COUNTS.unexpected),
            },
        )


# --------------------------------------------------------------------------- shoal


def _install_counting_connection() -> None:
    """Count what every shoal connection of this process receives: bytes as the
    transport hands them over (preamble and frames), and decoded messages by type."""
    from shoal.comm import tcp
    from shoal.comm.connection import Connection

    class CountingConnection(Connection):
        def data_received(self, data: bytes) -> None:
            COUNTS.recv_bytes += len(data)
            super().data_received(data)

        def _dispatch(self, frame: Any) -> None:
            for msg in frame.messages:
                COUNTS.msgs[type(msg).__name__] += 1
            super()._dispatch(frame)

    tcp.Connection = CountingConnection  # type: ignore[misc]  # this process only


class _Rss:
    """The process's RSS for heartbeats (a real worker sends its own), read at most
    once a second: thousands of workers share one process here."""

    def __init__(self) -> None:
        self.value = 0
        self.at = 0.0

    def __call__(self) -> int:
        from shoal.server.memory import process_memory

        now = time.monotonic()
        if now - self.at > 1.0:
            self.value, self.at = process_memory(), now
        return self.value


async def _shoal_worker(address: str, index: int, rss: _Rss) -> Coroutine[Any, Any, None]:
    """Register one simulated worker; returns its heartbeat loop (to run as a task)."""
    import psutil

    from shoal.comm.heartbeat import keep_alive
    from shoal.comm.tcp import connect
    from shoal.core.scheduler.membership import DEFAULT_SCHEDULER_TIMEOUT
    from shoal.protocol import messages as m

    fake = f"tcp://127.0.0.1:{FAKE_PORT_BASE + index}"
    hello = m.Hello(
        m.PROTOCOL_VERSION,
        "worker",
        name=f"sim-{index}",
        address=fake,
        nthreads=1,
        memory_limit=psutil.virtual_memory().total,
        pid=os.getpid(),
    )
    conn, _welcome = await connect(address, hello)

    def on_frame(conn: Any, frame: Any) -> None:
        for msg in frame.messages:
            t = type(msg)
            if t is m.CloseWorker:  # as a real worker: go
                conn.close()
            elif t is not m.FunctionDefs:  # an idle worker is sent nothing else
                COUNTS.unexpected[t.__name__] += 1

    def on_close(conn: Any, exc: BaseException | None) -> None:
        COUNTS.closed += 1

    conn.on_close = on_close
    conn.set_handler(on_frame)

    def beat(request_id: int) -> m.Message:
        return m.Heartbeat(request_id, rss(), 0, 0)  # idle: nothing spilled or executing

    return keep_alive(conn, beat, DEFAULT_SCHEDULER_TIMEOUT, 0.5)


async def _shoal_client(address: str, status: Status, keep: list[Any]) -> None:
    from shoal import Client

    client = await Client(address, asynchronous=True)
    keep.append(client)
    status.update(ready=status.data["ready"] + 1)


# --------------------------------------------------------------------------- dask


def _count_calls(cls: Any, method: str, label: str) -> None:
    """Count the calls of a coroutine method (requests to the scheduler) in COUNTS.msgs."""
    orig = getattr(cls, method)

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS.msgs[label] += 1
        return await orig(self, *args, **kwargs)

    setattr(cls, method, counted)


def _install_dask_counters(mode: str) -> None:
    from distributed import Client, Worker

    if mode == "dask-workers":
        _count_calls(Worker, "heartbeat", "worker heartbeats sent")
    else:
        _count_calls(Client, "_update_scheduler_info", "client scheduler-info polls sent")
        _count_calls(Client, "_heartbeat", "client heartbeats sent")


async def _dask_worker(address: str, index: int, status: Status, keep: list[Any]) -> None:
    from distributed import Worker

    w = Worker(address, nthreads=1, name=f"sim-{index}", host="127.0.0.1", dashboard=False)
    await w
    keep.append(w)
    status.update(ready=status.data["ready"] + 1)


async def _dask_client(address: str, status: Status, keep: list[Any]) -> None:
    from distributed import Client

    client = await Client(address, asynchronous=True)
    keep.append(client)
    status.update(ready=status.data["ready"] + 1)


# --------------------------------------------------------------------------- main


async def main(args: argparse.Namespace) -> None:
    status = Status(Path(args.dir), args.name, args.mode, args.n)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, status.write_counts)
    status.update(force=True)
    keep: list[Any] = []
    rss = _Rss()
    sem = asyncio.Semaphore(CONNECT_CONCURRENCY)
    forever: list[asyncio.Task[Any]] = []

    async def start_one(i: int) -> None:
        index = args.first + i
        async with sem:
            status.update(started=status.data["started"] + 1)
            try:
                if args.mode == "shoal-workers":
                    beats = await _shoal_worker(args.address, index, rss)
                    forever.append(asyncio.ensure_future(beats))  # until the connection closes
                    status.update(ready=status.data["ready"] + 1)
                elif args.mode == "shoal-clients":
                    await _shoal_client(args.address, status, keep)
                elif args.mode == "dask-workers":
                    await _dask_worker(args.address, index, status, keep)
                elif args.mode == "dask-clients":
                    await _dask_client(args.address, status, keep)
            except Exception as e:
                status.error(f"{index}: {type(e).__name__}: {e}")
                logging.getLogger("simulated").error("%s", traceback.format_exc())

    await asyncio.gather(*(start_one(i) for i in range(args.n)))
    status.update(force=True, done=True)
    print(f"{args.name}: {status.data['ready']}/{args.n} ready", flush=True)
    while True:  # idle; killed by the benchmark
        await asyncio.sleep(3600)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "mode", choices=["shoal-workers", "shoal-clients", "dask-workers", "dask-clients"]
    )
    p.add_argument("--address", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--first", type=int, default=0, help="index of the first worker (names, ports)")
    p.add_argument("--dir", required=True)
    p.add_argument("--name", required=True)
    return p.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.mode.startswith("shoal"):
        _install_counting_connection()
        from shoal.client.loop import run

        run(main(args))  # uvloop when installed, as shoal's own processes
    else:
        import dask

        if args.mode == "dask-workers":
            dask.config.set(DASK_WORKER_CONFIG)
        logging.getLogger("distributed").setLevel(logging.WARNING)
        _install_dask_counters(args.mode)
        asyncio.run(main(args))


if __name__ == "__main__":
    cli()
