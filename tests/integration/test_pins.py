"""Pins on real processes: a client pins workers, retirement refuses them (or ignores the
pins when told), leases run out, scheduler_info and get_events show what happened, and
a client process killed with SIGKILL takes its pins with it."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from subprocess_env import child_env

from shoal import Client, LocalCluster, Pin

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def cluster3() -> Iterator[LocalCluster]:
    """Three worker processes (retirement closes some: not the shared cluster)."""
    with LocalCluster(n_workers=3, threads_per_worker=1, timeout=60, validate=True) as c:
        yield c


def worker_pins(client: Client) -> dict[str, list[dict]]:
    return {a: w["pins"] for a, w in client.scheduler_info()["workers"].items()}


def wait_until(condition, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def test_pins_refuse_retirement_unless_ignored(cluster3: LocalCluster) -> None:
    with Client(cluster3, timeout=30) as client:
        client.wait_for_workers(3, timeout=30)
        w0, w1, w2 = sorted(client.scheduler_info()["workers"])
        start = time.time()
        pin = client.pin([w0, w1], "live state")
        assert isinstance(pin, Pin)
        assert pin.workers == (w0, w1) and pin.reason == "live state" and pin.lease is None
        owner = f"client:{client.id}"
        pins = worker_pins(client)
        shown = {"id": pin.id, "reason": "live state", "owner": owner, "expires": None}
        assert pins == {w0: [shown], w1: [shown], w2: []}

        result = client.retire_workers([w0, w2])
        assert result["retired"] == [w2]
        assert result["refused"] == {w0: f"pinned: live state (owner {owner})"}
        assert w0 in client.scheduler_info()["workers"]
        assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3

        result = client.retire_workers([w0], ignore_pins=True)
        assert result == {"retired": [w0], "refused": {}}
        assert worker_pins(client) == {w1: [shown]}  # the pin holds w1 only now

        events = client.get_events("pins")
        assert [e["action"] for _, e in events] == ["pin", "worker-gone"]
        assert all(start - 1 <= ts <= time.time() + 1 for ts, _ in events)  # wall clock
        assert events[0][1]["workers"] == [w0, w1] and events[0][1]["owner"] == owner
        assert events[1][1]["worker"] == w0
        assert client.get_events()["pins"] == events

        assert pin.release() is True
        assert pin.release() is False  # twice: a no-op
        assert worker_pins(client) == {w1: []}
        # the last worker: refused now for want of another worker, no longer for a pin
        refused = client.retire_workers([w1])["refused"]
        assert refused == {w1: "no other running worker could take its data"}


def test_context_manager_lease_and_bad_input(cluster: LocalCluster, client: Client) -> None:
    client.wait_for_workers(2, timeout=30)
    w0, w1 = sorted(client.scheduler_info()["workers"])
    name = client.scheduler_info()["workers"][w1]["name"]
    with client.pin(name, "by name") as pin:  # one worker, by its name
        assert pin.workers == (w1,)
        assert [p["reason"] for p in worker_pins(client)[w1]] == ["by name"]
    assert worker_pins(client)[w1] == [] and pin.release() is False

    before = time.time()
    leased = client.pin([w0], "leased", lease=1.0)
    assert leased.lease == 1.0 and before + 1.0 <= leased.expires <= time.time() + 1.0
    [shown] = worker_pins(client)[w0]
    assert shown["expires"] == leased.expires
    assert leased.renew() is True and leased.expires >= shown["expires"]
    wait_until(lambda: worker_pins(client)[w0] == [], what="the lease to run out")
    assert leased.renew() is False  # expired: gone for good
    last = client.get_events("pins")[-1][1]
    assert last["action"] == "unpin" and last["pin"] == leased.id and "expired" in last["why"]

    with pytest.raises(ValueError, match="'tcp://127.0.0.1:1': no such worker"):
        client.pin([w0, "tcp://127.0.0.1:1"], "x")
    for lease in (0, -1.5):
        with pytest.raises(ValueError, match="lease is a positive number of seconds"):
            client.pin([w0], "x", lease=lease)
    with pytest.raises(ValueError, match="at least one worker"):
        client.pin([], "x")
    assert worker_pins(client) == {w0: [], w1: []}
    assert client.get_events("no such topic") == []


def test_asynchronous_client(cluster: LocalCluster) -> None:
    async def main() -> None:
        async with Client(cluster, asynchronous=True, timeout=30) as client:
            info = await client.scheduler_info()
            w0 = sorted(info["workers"])[0]
            pin = await client.pin([w0], "async")
            assert (await client.scheduler_info())["workers"][w0]["pins"][0]["id"] == pin.id
            assert await pin.renew() is True
            async with pin:
                pass
            assert (await client.scheduler_info())["workers"][w0]["pins"] == []
            assert await pin.release() is False
            with pytest.raises(ValueError, match="no such worker"):
                await client.pin(["nowhere"], "x")
            actions = [e["action"] for _, e in await client.get_events("pins")]
            assert actions[-2:] == ["pin", "unpin"]

    asyncio.run(main())


CHILD = """
import sys, time
from shoal import Client
client = Client(sys.argv[1], timeout=30)
pin = client.pin([sys.argv[2]], "held by a process about to die")
print("pinned", pin.id, flush=True)
time.sleep(600)
"""


def test_a_killed_client_process_drops_its_pins(cluster: LocalCluster, client: Client) -> None:
    client.wait_for_workers(2, timeout=30)
    w0 = sorted(client.scheduler_info()["workers"])[0]
    env = child_env()
    env.update(cluster.security.to_env())
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, cluster.scheduler_address, w0],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().decode()
        assert line.startswith("pinned "), line
        pin_id = int(line.split()[1])
        [shown] = worker_pins(client)[w0]
        assert shown["id"] == pin_id and shown["owner"].startswith("client:")
        assert shown["owner"] != f"client:{client.id}"
        assert "pinned" in client.retire_workers([w0])["refused"][w0]
        killed_at = time.time()
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        wait_until(lambda: worker_pins(client)[w0] == [], what="the dead client's pin to go")
        when, last = client.get_events("pins")[-1]
        assert last == {**last, "action": "unpin", "pin": pin_id, "why": "its client left"}
        assert killed_at <= when <= time.time()  # stamped when it happened
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        if child.stdout is not None:
            child.stdout.close()


def test_closing_a_client_releases_its_pins(cluster: LocalCluster, client: Client) -> None:
    client.wait_for_workers(2, timeout=30)
    w0, w1 = sorted(client.scheduler_info()["workers"])
    other = Client(cluster, timeout=30)
    try:
        pin = other.pin([w0, w1], "until I close")
        mine = client.pin([w1], "mine")
        counts = {a: len(pins) for a, pins in worker_pins(client).items()}
        assert counts == {w0: 1, w1: 2}
    finally:
        other.close()
    wait_until(lambda: worker_pins(client)[w0] == [], what="the closed client's pin to go")
    assert [p["id"] for p in worker_pins(client)[w1]] == [mine.id]  # not another's
    assert pin.release() is False  # went with its client
    assert mine.release() is True
