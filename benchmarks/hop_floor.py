"""The floor under a one-task compute on a cluster: Dask's ``compute()`` around a ``get``
that only carries a message through bare asyncio processes (not part of shoal).

    PYTHONPATH=. python benchmarks/hop_floor.py [--rounds 200] [--pause 0.05]

No scheduler or worker logic at all: a *relay* process (where a scheduler would be) and
an *echo* process (where a worker would be), each an asyncio loop with a plain
``asyncio.Protocol`` and a 4-byte length prefix on loopback TCP, as shoal's servers
are. Dask's ``compute()`` of ``delayed(sum)([1, 2, 3])`` runs with each of these as its
scheduler (``dask.config.set(scheduler=get)``), alternating round by round, with
``--pause`` seconds after each compute (the interactive benchmark's conditions):

* ``sync``: dask's synchronous scheduler, the bar's reference;
* ``no-op``: a ``get`` that returns the answer at once: what ``compute()`` costs around
  any scheduler;
* ``loop-thread``: shoal's shape today. The caller writes the request itself, the relay
  forwards it to the echo, the echo answers the relay, the relay forwards the answer, and
  the client's loop thread reads it and wakes the caller (four hops and a thread wake);
* ``caller-reads``: the same four hops, the caller reading the answer itself (no loop
  thread in between);
* ``direct``: the echo answers the caller itself (three hops), the caller reading it: the
  fewest for any design that puts a scheduler between a client and its workers;
* ``leased``: the caller sends the request to the echo itself and tells the relay after
  (a design where the scheduler leased the worker beforehand, as Ray's direct task
  submission does); the echo answers the caller, then tells the relay. Two hops on the
  path, and both notices' writes paid by the caller and the echo;
* ``shoal``: a shoal cluster (a scheduler process and two one-thread worker processes,
  ``benchmarks/cluster.py``), its client as Dask's scheduler (``--no-shoal``: left out).

The relay's and the echo's work is a dict lookup and a write: every microsecond of a
real scheduler's or worker's logic (placing, encoding, running the task) comes on top.
So if ``direct`` is above 1.5x ``sync`` here, no scheduler in this process layout can
bring this compute within 1.5x of the synchronous scheduler on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

HEADER = struct.Struct("!I")
REQUEST = b"x" * 90  # about the size of shoal's one-task SubmitTasks/ComputeTask frames


class _Framed(asyncio.Protocol):
    """Length-prefixed messages in, ``on_message(self, payload)`` out."""

    def __init__(self, on_message: Callable[[_Framed, bytes], None]):
        self.on_message = on_message
        self.buffer = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            (n,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < 4 + n:
                return
            payload = bytes(self.buffer[4 : 4 + n])
            del self.buffer[: 4 + n]
            self.on_message(self, payload)

    def send(self, payload: bytes) -> None:
        self.transport.write(HEADER.pack(len(payload)) + payload)


# ----------------------------------------------------------------------- the relay


async def _exit_with_parent() -> None:
    """A relay or echo left behind by a killed benchmark ends on its own."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    os._exit(0)


async def _relay(port_file: str) -> None:
    """Messages from a client (first byte ``C``) go to the echo; the echo's answers
    (``W``) go back to the client whose id they carry."""
    peers: dict[bytes, _Framed] = {}

    def on_message(conn: _Framed, payload: bytes) -> None:
        kind, rest = payload[:1], payload[1:]
        if kind == b"H":  # hello: b"H" + role
            peers[rest] = conn
        elif kind == b"N":  # a notice (leased): the scheduler's bookkeeping, not timed
            pass
        elif kind == b"C":
            peers[b"echo"].send(payload)
        else:  # b"W": the echo's answer, for the client
            peers[b"client"].send(payload)

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Framed(on_message), "127.0.0.1", 0)
    with open(port_file + ".tmp", "w") as fh:
        fh.write(str(server.sockets[0].getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    await _exit_with_parent()


async def _echo(relay_port: int) -> None:
    """Answer each request: to the relay, or (``direct`` ones, flag ``D``) to the client
    on the port the request names."""
    loop = asyncio.get_running_loop()
    direct: dict[int, _Framed] = {}

    def on_message(conn: _Framed, payload: bytes) -> None:
        answer = b"W" + str(sum([1, 2, 3])).encode() + payload[1:]
        if payload[1:2] == b"L":  # leased: answer the caller, then tell the relay
            conn.send(answer)
            relay.send(b"N" + payload[2:])
        elif payload[1:2] == b"D":
            port = int(payload[2:8])
            client = direct.get(port)
            if client is not None:
                client.send(answer)
                return
            loop.create_task(_connect_back(port, answer))
        else:
            conn.send(answer)

    async def _connect_back(port: int, answer: bytes) -> None:
        _, proto = await loop.create_connection(lambda: _Framed(on_message), "127.0.0.1", port)
        direct[port] = proto
        proto.send(answer)

    _, relay = await loop.create_connection(lambda: _Framed(on_message), "127.0.0.1", relay_port)
    relay.send(b"Hecho")
    await _exit_with_parent()


# ----------------------------------------------------------------------- the client


class _BlockingConn:
    """A blocking socket with the same framing, for a caller that reads for itself."""

    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock

    def send(self, payload: bytes) -> None:
        self.sock.sendall(HEADER.pack(len(payload)) + payload)

    def recv(self) -> bytes:
        head = self._exactly(4)
        return self._exactly(HEADER.unpack(head)[0])

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data


class Client:
    def __init__(self, relay_port: int):
        # caller-reads and direct: blocking sockets the caller reads itself
        self.blocking = _BlockingConn(socket.create_connection(("127.0.0.1", relay_port)))
        self.blocking.send(b"Hclient")
        listener = socket.create_server(("127.0.0.1", 0))
        self.listen_port = listener.getsockname()[1]
        self.listener = listener
        self.direct: _BlockingConn | None = None
        # loop-thread: a second client process would do; a second connection serves,
        # the relay answering whichever connection said hello last (set per mode below)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.waiter: threading.Event | None = None
        self.answer = b""
        fut = asyncio.run_coroutine_threadsafe(self._connect(relay_port), self.loop)
        self.looped: _Framed = fut.result(10)
        # the same socket, for the caller's own writes (asyncio's wrapper has no send)
        fd = self.looped.transport.get_extra_info("socket").fileno()
        self.looped_sock = socket.socket(fileno=os.dup(fd))
        self.mode = ""

    async def _connect(self, port: int) -> _Framed:
        def on_message(conn: _Framed, payload: bytes) -> None:
            self.answer = payload
            assert self.waiter is not None
            self.waiter.set()

        _, proto = await asyncio.get_running_loop().create_connection(
            lambda: _Framed(on_message), "127.0.0.1", port
        )
        return proto

    def use(self, mode: str) -> None:
        """Make the relay answer the connection of ``mode`` (a hello, answered by nothing)."""
        if mode == self.mode:
            return
        if mode == "loop-thread":
            self.looped_sock.sendall(HEADER.pack(7) + b"Hclient")
        else:
            self.blocking.send(b"Hclient")
        time.sleep(0.01)
        self.mode = mode

    def get_loop_thread(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        self.waiter = threading.Event()
        # the caller writes itself (as shoal's direct write does), the loop thread reads
        self.looped_sock.sendall(HEADER.pack(len(REQUEST) + 1) + b"C" + REQUEST)
        self.waiter.wait(10)
        return [int(self.answer[1:2])]

    def get_caller_reads(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        self.blocking.send(b"C" + REQUEST)
        return [int(self.blocking.recv()[1:2])]

    def get_leased(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        if self.direct is None:  # the echo's connection back to us, made by a direct call
            self.get_direct(dsk, keys)
        assert self.direct is not None
        self.direct.send(b"CL" + REQUEST)
        self.blocking.send(b"N" + REQUEST)  # the scheduler told after the worker
        return [int(self.direct.recv()[1:2])]

    def get_direct(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        self.blocking.send(b"CD" + b"%06d" % self.listen_port + REQUEST)
        if self.direct is None:
            sock, _ = self.listener.accept()
            self.direct = _BlockingConn(sock)
        return [int(self.direct.recv()[1:2])]


def no_op_get(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    return [6]


# ----------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds after each compute")
    parser.add_argument("--no-shoal", action="store_true", help="leave shoal out")
    parser.add_argument("--role", choices=["relay", "echo"], help=argparse.SUPPRESS)
    parser.add_argument("--port-file", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "relay":
        asyncio.run(_relay(args.port_file))
        return 0
    if args.role == "echo":
        asyncio.run(_echo(args.port))
        return 0

    import signal
    import tempfile

    import dask

    def on_term(signum: int, frame: Any) -> None:  # so that the finally below runs
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)

    port_file = os.path.join(tempfile.mkdtemp(prefix="hop-floor-"), "port")
    me = [sys.executable, os.path.abspath(__file__)]
    procs = [subprocess.Popen([*me, "--role", "relay", "--port-file", port_file])]
    cluster = None
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            if time.monotonic() > deadline:
                raise TimeoutError("the relay did not start")
            time.sleep(0.02)
        with open(port_file) as fh:
            port = int(fh.read())
        procs.append(subprocess.Popen([*me, "--role", "echo", "--port", str(port)]))
        time.sleep(1.0)
        client = Client(port)
        value = dask.delayed(sum)([1, 2, 3])
        systems: dict[str, tuple[Any, str]] = {
            "sync": ("sync", ""),
            "no-op": (no_op_get, ""),
            "loop-thread": (client.get_loop_thread, "loop-thread"),
            "caller-reads": (client.get_caller_reads, "caller-reads"),
            "direct": (client.get_direct, "caller-reads"),
            "leased": (client.get_leased, "caller-reads"),
        }
        if not args.no_shoal:
            from benchmarks.cluster import SYSTEMS, Cluster

            cluster = Cluster(SYSTEMS["shoal"]).start()
            systems["shoal"] = (cluster.client.get, "")
        times: dict[str, list[float]] = {name: [] for name in systems}
        names = list(systems)
        for r in range(args.rounds + 5):
            for i in range(len(names)):
                name = names[(r + i) % len(names)]  # the first of a round rotates
                scheduler, mode = systems[name]
                if mode:
                    client.use(mode)
                with dask.config.set(scheduler=scheduler):
                    t0 = time.perf_counter()
                    result = value.compute()
                    elapsed = time.perf_counter() - t0
                assert result == 6, (name, result)
                if r >= 5:  # warm-up rounds
                    times[name].append(elapsed)
                time.sleep(args.pause)
    finally:
        if cluster is not None:
            cluster.stop()
        for proc in procs:
            proc.kill()
            proc.wait()
    sync = statistics.median(times["sync"])
    print(
        f"# hop floor: delayed(sum)([1, 2, 3]).compute(), {args.rounds} rounds, "
        f"{args.pause} s pause; {platform.node()}, load {os.getloadavg()}"
    )
    print("| scheduler | median ms | p90 ms | / sync |")
    print("|---|---|---|---|")
    for name in names:
        ts = sorted(times[name])
        med = statistics.median(ts)
        p90 = ts[math.ceil(0.9 * len(ts)) - 1]  # nearest rank, as interactive.py's
        print(f"| {name} | {med * 1e3:.3f} | {p90 * 1e3:.3f} | {med / sync:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
