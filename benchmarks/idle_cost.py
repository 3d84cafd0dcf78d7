"""What a pause between computes costs on this machine (not part of shoal).

    PYTHONPATH=. python benchmarks/idle_cost.py [--rounds 200] [--pauses 0.001,0.005,0.02,0.05]
        [--pin] [--no-shoal]

The interactive benchmark leaves 50 ms between computes, as a notebook user does. This
measures what that pause does to the next compute, after each pause of ``--pauses``:

* ``ping-pong``: a 120-byte message to a forked uvloop echo process and back, over
  loopback TCP (the round trip, and the ``send`` call alone): the machine, no Python
  logic in between;
* ``sync get`` and ``shoal get``: the time inside the scheduler's ``get`` of Dask's
  ``delayed(sum)([1, 2, 3]).compute()``, Dask's synchronous scheduler and a shoal
  client (a ``LocalCluster`` of two one-thread workers) alternated. Dask's own work
  around ``get`` is left out: it is the same for both;
* then, at the shortest and the longest pause, each process's CPU time per compute
  (user and system, from ``/proc``; with the sync scheduler for comparison).

``--pin`` runs this process, and every process it starts, on CPU 0 alone
(``sched_setaffinity``, inherited): no wake-up crosses CPUs, so what the pause still
costs then is not the interrupt that wakes an idle CPU but caches and TLBs emptied
while the CPU was idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MESSAGE = b"x" * 120


def _echo(port: int) -> None:
    """The forked child: echo every read back until the connection ends."""

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            os._exit(0)

    async def main() -> None:
        await asyncio.get_running_loop().create_connection(Echo, "127.0.0.1", port)
        await asyncio.sleep(3600)

    from shoal.client.loop import run

    run(main())


def ping_pong(pause: float, rounds: int) -> tuple[float, float]:
    """Median (send, round trip) seconds after ``pause`` seconds idle."""
    server = socket.create_server(("127.0.0.1", 0))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            _echo(server.getsockname()[1])
        finally:
            os._exit(0)
    conn, _ = server.accept()
    server.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sends, trips = [], []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            conn.sendall(MESSAGE)
            t1 = time.perf_counter()
            got = 0
            while got < len(MESSAGE):
                got += len(conn.recv(len(MESSAGE)))
            trips.append(time.perf_counter() - t0)
            sends.append(t1 - t0)
            time.sleep(pause)
    finally:
        conn.close()
        os.waitpid(pid, 0)
    return statistics.median(sends), statistics.median(trips)


class TimedGet:
    """A Dask ``get`` that records how long each call of ``inner`` took."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.seconds: list[float] = []

    def __call__(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        result = self.inner(dsk, keys, **kwargs)
        self.seconds.append(time.perf_counter() - t0)
        return result


def cpu_seconds(pids: dict[str, int]) -> dict[str, tuple[float, float]]:
    import psutil

    out = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[name] = (times.user, times.system)
    return out


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200, help="per pause and system")
    p.add_argument("--pauses", default="0.001,0.005,0.02,0.05", help="seconds, comma separated")
    p.add_argument("--pin", action="store_true", help="everything on CPU 0")
    p.add_argument("--no-shoal", action="store_true", help="the ping-pong alone")
    args = p.parse_args(argv)
    pauses = [float(s) for s in args.pauses.split(",")]
    if args.rounds < 1 or not pauses or min(pauses) < 0:
        p.error("--rounds must be at least 1 and every pause at least 0")
    signal.signal(signal.SIGTERM, _exit_on_term)  # so that the cluster is stopped
    if args.pin:
        os.sched_setaffinity(0, {0})
    print(
        f"# idle cost: {args.rounds} rounds per pause; pinned to CPU 0: {args.pin}; "
        f"load {os.getloadavg()}"
    )
    print("| pause ms | send µs | round trip µs |")
    print("|---|---|---|")
    for pause in pauses:
        send, trip = ping_pong(pause, args.rounds)
        print(f"| {pause * 1e3:g} | {send * 1e6:.1f} | {trip * 1e6:.1f} |", flush=True)
    if not args.no_shoal:
        computes(pauses, args.rounds)
    return 0


def computes(pauses: list[float], rounds: int) -> None:
    import dask
    from dask.local import get_sync

    from shoal import Client, LocalCluster

    value = dask.delayed(sum)([1, 2, 3])
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        pids = {"client": os.getpid(), "scheduler": client.run_on_scheduler(os.getpid)}
        for i, pid in enumerate(sorted(client.run(os.getpid).values())):
            pids[f"worker {i}"] = pid
        systems = {"sync": TimedGet(get_sync), "shoal": TimedGet(client.get)}
        for get in systems.values():  # warm-up: imports, first connections
            with dask.config.set(scheduler=get):
                for _ in range(5):
                    value.compute()
        print()
        print("| pause ms | sync get ms | shoal get ms | shoal / sync |")
        print("|---|---|---|---|")
        cpu: dict[tuple[str, float], dict[str, tuple[float, float]]] = {}
        for pause in pauses:
            for get in systems.values():
                get.seconds.clear()
            for r in range(rounds):
                for name in ("sync", "shoal") if r % 2 else ("shoal", "sync"):
                    with dask.config.set(scheduler=systems[name]):
                        assert value.compute() == 6
                    time.sleep(pause)
            sync, shoal = (statistics.median(systems[n].seconds) for n in ("sync", "shoal"))
            print(
                f"| {pause * 1e3:g} | {sync * 1e3:.3f} | {shoal * 1e3:.3f} | {shoal / sync:.2f} |",
                flush=True,
            )
        for pause in sorted({min(pauses), max(pauses)}):
            for name, get in systems.items():
                before = cpu_seconds(pids)
                with dask.config.set(scheduler=get):
                    for _ in range(rounds):
                        value.compute()
                        time.sleep(pause)
                after = cpu_seconds(pids)
                cpu[(name, pause)] = {
                    k: (
                        (after[k][0] - before[k][0]) / rounds,
                        (after[k][1] - before[k][1]) / rounds,
                    )
                    for k in pids
                }
        print()
        print(
            "CPU ms per compute, user + system (the clock ticks of /proc: coarse below "
            "a few hundred rounds):"
        )
        print()
        print("| scheduler | pause ms | " + " | ".join(pids) + " |")
        print("|---|---|" + "---|" * len(pids))
        for (name, pause), per in cpu.items():
            cells = " | ".join(f"{u * 1e3:.3f} + {s * 1e3:.3f}" for u, s in per.values())
            print(f"| {name} | {pause * 1e3:g} | {cells} |")


if __name__ == "__main__":
    raise SystemExit(main())
