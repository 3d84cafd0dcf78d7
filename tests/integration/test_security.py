"""Cluster token and TLS on real processes: who gets in, who is refused and how, and
that a LocalCluster only listens on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from shoal import Client, LocalCluster
from shoal.comm.handshake import GREETING_SIZE, MAGIC, REFUSED, ConnectorHandshake
from shoal.comm.security import Security
from shoal.comm.tcp import HandshakeError, connect, parse_address
from shoal.protocol import messages as m
from shoal.protocol.framing import FrameDecoder, encode_frame

pytestmark = pytest.mark.timeout(90)

Spawn = Callable[..., subprocess.Popen[bytes]]


def child_env() -> dict[str, str]:
    """Our environment with our import path (not conftest's helper: workers import this
    module by name to run its functions, and would find another conftest)."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
    return env


def inc(x):
    return x + 1


def add(x, y):
    return x + y


def worker_pid():
    return os.getpid()


def _exercise(client: Client, processes: bool = True) -> None:
    """Submit and result, a dependency moved between workers, scatter and gather."""
    assert client.submit(inc, 1).result(timeout=30) == 2
    first, second = sorted(client.scheduler_info()["workers"])
    a = client.submit(inc, 10, workers=first, pure=False)
    b = client.submit(add, a, 1, workers=second, pure=False)  # a travels worker to worker
    assert b.result(timeout=30) == 12
    if processes:  # the restrictions did put the two on different worker processes
        pa = client.submit(worker_pid, workers=first, pure=False).result(timeout=30)
        pb = client.submit(worker_pid, workers=second, pure=False).result(timeout=30)
        assert pa != pb, "both tasks ran on one worker: nothing was transferred"
    scattered = client.scatter([5, 6, 7])
    assert client.gather(scattered) == [5, 6, 7]
    assert client.submit(sum, scattered).result(timeout=30) == 18


def _refusal(address: str, security: Security) -> str:
    async def attempt() -> str:
        hello = m.Hello(m.PROTOCOL_VERSION, "client", name="intruder")
        try:
            conn, _ = await connect(address, hello, timeout=10, security=security)
        except HandshakeError as e:
            return str(e)
        conn.close()
        raise AssertionError(f"{address} welcomed a connection with {security!r}")

    return asyncio.run(attempt())


def _listening_ips(pid: int) -> list[str]:
    conns = psutil.Process(pid).net_connections(kind="inet")
    return [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]


# ------------------------------------------------------------------------ token


def test_local_cluster_has_a_token_by_default_and_clients_use_it(
    cluster: LocalCluster, client: Client
) -> None:
    token = cluster.security.token
    assert token and len(token) >= 32
    _exercise(client)
    # an address string of this process's own cluster finds its token too
    with Client(cluster.scheduler_address, timeout=30) as again:
        assert again.submit(inc, 2).result(timeout=30) == 3
    for pid in [cluster._procs[0].pid, *cluster.worker_pids]:
        assert token not in " ".join(psutil.Process(pid).cmdline()), "token on a command line"


def test_wrong_or_missing_token_is_refused_and_the_cluster_carries_on(
    cluster: LocalCluster, client: Client
) -> None:
    address = cluster.scheduler_address
    assert "wrong cluster token" in _refusal(address, Security(token="not-the-token"))
    assert "requires a cluster token and none was given" in _refusal(address, Security())
    worker = sorted(client.scheduler_info()["workers"])[0]
    assert "wrong cluster token" in _refusal(worker, Security(token="not-the-token"))
    assert "requires a cluster token" in _refusal(worker, Security())
    with pytest.raises(HandshakeError, match="wrong cluster token"):
        Client(address, security=Security(token="nope"), timeout=10)
    assert client.submit(inc, 41).result(timeout=30) == 42
    assert len(client.scheduler_info()["workers"]) == 2
    assert all(p.poll() is None for p in cluster._procs), "a cluster process died"


def test_token_cluster_without_a_token() -> None:
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, token=False) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        assert cluster.security.token is None
        assert client.submit(inc, 1).result(timeout=30) == 2
        # a token where none is used is a clear error, not a silent downgrade
        assert "does not use a cluster token" in _refusal(
            cluster.scheduler_address, Security(token="mine")
        )


@pytest.fixture
def cli_scheduler(spawn: Spawn, tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen]]:
    """``shoal scheduler`` with a token from its environment and its log in a pipe."""
    token = "cli-token-" + os.urandom(8).hex()
    sched_file = tmp_path / "scheduler.json"
    proc = spawn(
        "scheduler",
        "--port",
        "0",
        "--scheduler-file",
        str(sched_file),
        "--quiet",
        "--log-level",
        "info",
        env={**child_env(), "SHOAL_TOKEN": token},
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not sched_file.exists():
        assert proc.poll() is None, "the scheduler exited"
        assert time.monotonic() < deadline, "no scheduler file"
        time.sleep(0.05)
    yield json.loads(sched_file.read_text())["address"], token, proc


def _scheduler_log(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)
    return err.decode()


def _send_raw(address: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and return all the server sends back."""
    with socket.create_connection(parse_address(address), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_nothing_is_decoded_before_the_token_is_proven(
    cli_scheduler: tuple[str, str, subprocess.Popen],
) -> None:
    address, token, proc = cli_scheduler
    garbage_frame = b"SH\x00\x00\x00\x00\x00\x06" + b"\xc1" * 6  # a malformed msgpack body
    # 1. a wrong proof, with a malformed frame right behind it
    forger = ConnectorHandshake("wrong-token")
    with socket.create_connection(parse_address(address), timeout=10) as sock:
        sock.sendall(forger.greeting())
        greeting = b""
        while len(greeting) < GREETING_SIZE:
            greeting += sock.recv(GREETING_SIZE - len(greeting))
        proof, _ = forger.feed(greeting)
        sock.sendall(proof + garbage_frame)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply[:1] == REFUSED
    [frame] = FrameDecoder().feed(reply[1:])
    assert frame.messages == [m.Refused("wrong cluster token")]
    # 2. no token at all, then a Hello and garbage
    hello_message = m.Hello(m.PROTOCOL_VERSION, "client", name="no-token")
    hello = b"".join(bytes(piece) for piece in encode_frame([hello_message]))
    reply = _send_raw(address, ConnectorHandshake(None).greeting() + hello + garbage_frame)
    assert reply[:4] == MAGIC
    [frame] = FrameDecoder().feed(reply[GREETING_SIZE:])
    assert frame.messages == [m.Refused("this cluster requires a token and none was given")]
    # 3. an old-style peer that starts with a frame: refused at its first byte
    reply = _send_raw(address, hello)
    assert "did not open with shoal's connection preamble" in _decode_refusal(reply)
    # the scheduler still serves a client with the token
    with Client(address, security=Security(token=token), timeout=30) as c:
        assert c.scheduler_info()["workers"] == {}
    log = _scheduler_log(proc)
    assert log.count("refused a connection") == 3, log
    assert "wrong cluster token" in log
    for decode_error in ("protocol error", "malformed", "invalid message", "Hello message first"):
        assert decode_error not in log, f"something was decoded before the token: {log}"


def _decode_refusal(reply: bytes) -> str:
    frames = FrameDecoder().feed(reply[GREETING_SIZE:])
    [refused] = [msg for f in frames for msg in f.messages]
    assert isinstance(refused, m.Refused)
    return refused.reason


def test_cli_workers_with_a_wrong_or_missing_token_exit_with_the_reason(
    cli_scheduler: tuple[str, str, subprocess.Popen], spawn: Spawn
) -> None:
    address, token, _ = cli_scheduler
    for env_token, reason in [
        ("wrong", "wrong cluster token"),
        ("", "requires a cluster token and none was given"),
    ]:
        w = spawn(
            "worker",
            address,
            "--timeout",
            "20",
            env={**child_env(), "SHOAL_TOKEN": env_token},
            stderr=subprocess.PIPE,
        )
        _, err = w.communicate(timeout=20)  # at once: a refusal is not retried
        assert w.returncode != 0
        assert reason in err.decode(), err.decode()
    good = spawn("worker", address, "--token", token, "--name", "good")
    with Client(address, security=Security(token=token), timeout=30) as c:
        deadline = time.monotonic() + 30
        while not c.scheduler_info()["workers"]:
            assert time.monotonic() < deadline, "the worker with the token never joined"
            time.sleep(0.05)
        assert c.submit(inc, 1).result(timeout=30) == 2
    good.send_signal(signal.SIGTERM)
    good.wait(20)


def test_a_client_takes_the_token_from_the_environment(
    cli_scheduler: tuple[str, str, subprocess.Popen], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, token, _ = cli_scheduler
    monkeypatch.setenv("SHOAL_TOKEN", token)
    with Client(address, timeout=30) as c:
        assert c.security.token == token
        assert c.scheduler_info()["workers"] == {}
    monkeypatch.setenv("SHOAL_TOKEN", "stale")
    with pytest.raises(HandshakeError, match="wrong cluster token"):
        Client(address, timeout=10)


# ------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(
        n_workers=2, threads_per_worker=1, security=Security.temporary(), validate=True
    ) as c:
        yield c


def test_tls_end_to_end(tls_cluster: LocalCluster) -> None:
    assert tls_cluster.scheduler_address.startswith("tls://127.0.0.1:")
    assert tls_cluster.security.token and tls_cluster.security.require_encryption
    with Client(tls_cluster, timeout=30) as client:
        workers = client.scheduler_info()["workers"]
        assert len(workers) == 2
        assert all(a.startswith("tls://127.0.0.1:") for a in workers), workers
        _exercise(client)


def test_tls_in_one_process() -> None:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, security=Security.temporary()
        ) as cluster,
        Client(cluster, timeout=30) as client,
    ):
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        _exercise(client, processes=False)


def test_tls_without_a_certificate_is_refused(tls_cluster: LocalCluster) -> None:
    # TLS 1.3: the client's side of the handshake completes, then the server, finding no
    # client certificate, aborts; not one byte of shoal comes back
    ctx = ssl.create_default_context(cafile=tls_cluster.security.tls_ca_file)
    ctx.check_hostname = False
    host, port = parse_address(tls_cluster.scheduler_address)
    with socket.create_connection((host, port), timeout=10) as raw:
        got = b""
        try:
            with ctx.wrap_socket(raw) as sock:
                sock.sendall(ConnectorHandshake(tls_cluster.security.token).greeting())
                while chunk := sock.recv(65536):
                    got += chunk
        except (ssl.SSLError, ConnectionResetError) as e:
            assert "certificate" in str(e).lower() or isinstance(e, ConnectionResetError), e
        assert got == b"", "the scheduler answered a client without a certificate"
    _still_serves(tls_cluster)


def test_tls_certificate_of_another_ca_is_refused(tls_cluster: LocalCluster, tmp_path) -> None:
    token = tls_cluster.security.token
    stranger = Security.temporary(token=token, directory=str(tmp_path))
    # the stranger does not trust the cluster's certificate...
    message = _refusal(tls_cluster.scheduler_address, stranger)
    assert "TLS handshake" in message and "certificate verify failed" in message, message
    # ...and the cluster does not trust the stranger's, even when it trusts the cluster
    sneaky = Security(
        token=token,
        tls_ca_file=tls_cluster.security.tls_ca_file,
        tls_cert=stranger.tls_cert,
        tls_key=stranger.tls_key,
    )
    message = _refusal(tls_cluster.scheduler_address, sneaky)
    assert "closed the connection during the handshake" in message, message
    _still_serves(tls_cluster)


def test_tls_with_a_wrong_token_is_refused(tls_cluster: LocalCluster) -> None:
    wrong = Security(
        token="wrong",
        tls_ca_file=tls_cluster.security.tls_ca_file,
        tls_cert=tls_cluster.security.tls_cert,
        tls_key=tls_cluster.security.tls_key,
    )
    assert "wrong cluster token" in _refusal(tls_cluster.scheduler_address, wrong)


def test_require_encryption_refuses_plain_tcp(tls_cluster: LocalCluster, spawn: Spawn) -> None:
    plain = tls_cluster.scheduler_address.replace("tls://", "tcp://")
    with pytest.raises(ValueError, match="encryption is required and tcp:// is plain text"):
        Client(plain, security=tls_cluster.security, timeout=10)
    # a worker told to use tcp:// refuses before it connects
    w = spawn(
        "worker",
        plain,
        env={**child_env(), **tls_cluster.security.to_env()},
        stderr=subprocess.PIPE,
    )
    _, err = w.communicate(timeout=30)
    assert w.returncode != 0
    assert "encryption is required" in err.decode(), err.decode()
    # a plain client that tries anyway gets nothing from the TLS listener
    message = _refusal(plain, Security(token=tls_cluster.security.token))
    assert "closed the connection during the handshake (is it a tls:// address?)" in message
    # and a scheduler cannot be told to require encryption without TLS credentials
    s = spawn("scheduler", "--port", "0", "--require-encryption", stderr=subprocess.PIPE)
    _, err = s.communicate(timeout=30)
    assert s.returncode != 0
    assert "require_encryption needs TLS credentials" in err.decode(), err.decode()
    _still_serves(tls_cluster)


def _still_serves(cluster: LocalCluster) -> None:
    with Client(cluster, timeout=30) as client:
        assert client.submit(inc, 100).result(timeout=30) == 101
    assert all(p.poll() is None for p in cluster._procs), "a cluster process died"


# ------------------------------------------------------------------------ loopback


@pytest.mark.parametrize("kind", ["tcp", "tls"])
def test_local_cluster_listens_on_loopback_only(
    kind: str, cluster: LocalCluster, tls_cluster: LocalCluster
) -> None:
    c = cluster if kind == "tcp" else tls_cluster
    pids = [c._procs[0].pid, *c.worker_pids]
    assert len(pids) == 3
    for pid in pids:
        ips = _listening_ips(pid)
        assert ips, f"process {pid} listens nowhere"
        assert set(ips) == {"127.0.0.1"}, f"process {pid} listens on {ips}"
