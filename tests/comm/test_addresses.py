"""Which address a worker listens on and advertises (shoal/comm/addresses.py), and the
scheduler's refusal of a loopback worker reached over another interface. The real
multi-host runs are in tests/multihost/."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from shoal.comm.addresses import (
    WorkerAddressOptions,
    advertised_listener,
    interface_address,
    route_to,
    unreachable_advertisement,
)
from shoal.server.scheduler import Scheduler
from shoal.server.worker import Worker

LOOPBACK_INTERFACE = next(
    (
        name
        for name, entries in psutil.net_if_addrs().items()
        if any(e.address == "127.0.0.1" for e in entries)
    ),
    None,
)


def test_by_default_a_worker_listens_and_advertises_its_route_to_the_scheduler() -> None:
    options = WorkerAddressOptions().check()
    assert options.listen_on("tcp://127.0.0.1:8786") == ("127.0.0.1", 0)
    assert options.advertise("tcp://127.0.0.1:4000", "tcp://127.0.0.1:8786") == (
        "tcp://127.0.0.1:4000"
    )
    assert route_to("tcp://127.0.0.1:1") == "127.0.0.1"


def test_host_interface_listen_and_contact_addresses() -> None:
    scheduler = "tcp://127.0.0.1:8786"
    assert WorkerAddressOptions(host="127.0.0.2", port=5).listen_on(scheduler) == ("127.0.0.2", 5)
    wildcard = WorkerAddressOptions(host="0.0.0.0")
    # listening everywhere, it advertises its side of the route to the scheduler
    assert wildcard.advertise("tcp://0.0.0.0:4000", scheduler) == "tcp://127.0.0.1:4000"
    listen = WorkerAddressOptions(listen_address="tls://0.0.0.0:8000")
    assert listen.check().listen_on(scheduler) == ("0.0.0.0", 8000)
    nat = WorkerAddressOptions(contact_address="tcp://203.0.113.7:9000", port=9000)
    assert nat.check().listen_on(scheduler) == ("0.0.0.0", 9000)  # every interface
    assert nat.advertise("tcp://0.0.0.0:9000", scheduler) == "tcp://203.0.113.7:9000"
    if LOOPBACK_INTERFACE is not None:
        by_name = WorkerAddressOptions(interface=LOOPBACK_INTERFACE).check()
        assert by_name.listen_on(scheduler) == ("127.0.0.1", 0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            WorkerAddressOptions(host="127.0.0.1", listen_address="tcp://0.0.0.0:1"),
            "at most one of --host, --listen-address",
        ),
        (
            WorkerAddressOptions(listen_address="tcp://0.0.0.0:1", port=5),
            "--listen-address carries its port",
        ),
        (WorkerAddressOptions(contact_address="nowhere"), "--contact-address: not a host:port"),
        (WorkerAddressOptions(listen_address="udp://x:1"), "--listen-address: unsupported"),
        (WorkerAddressOptions(interface="no-such-if0"), "no network interface 'no-such-if0'"),
    ],
)
def test_contradicting_or_bad_options_are_refused_naming_them(
    options: WorkerAddressOptions, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        options.check()
    with pytest.raises(ValueError, match="no network interface"):
        interface_address("no-such-if0")


def test_loopback_is_unreachable_only_when_the_scheduler_was_reached_elsewhere() -> None:
    assert unreachable_advertisement("tcp://127.0.0.1:5", "127.0.0.1") is None
    assert unreachable_advertisement("tcp://10.0.0.2:5", "10.0.0.1") is None
    assert unreachable_advertisement("tcp://127.0.0.1:5", None) is None
    why = unreachable_advertisement("tcp://127.0.0.1:5", "10.0.0.1")
    assert why is not None and "loopback address tcp://127.0.0.1:5" in why and "10.0.0.1" in why
    assert unreachable_advertisement("tcp://localhost:5", "10.0.0.1") is not None


def test_a_scheduler_on_every_interface_advertises_a_reachable_address() -> None:
    assert advertised_listener("tcp://127.0.0.1:8786") == "tcp://127.0.0.1:8786"
    address = advertised_listener("tcp://0.0.0.0:8786")
    assert not address.startswith("tcp://0.0.0.0:") and address.endswith(":8786")


@pytest.mark.timeout(30)
def test_a_loopback_worker_joins_a_scheduler_on_another_loopback_address() -> None:
    # 127.0.0.1 and 127.0.0.2 are both loopback: one host, no refusal (the refusal over
    # a real network is in tests/multihost)
    async def join(listen_host: str, worker_host: str) -> str:
        s = await Scheduler(host=listen_host, port=0).start()
        w = Worker(s.address, host=worker_host)
        try:
            await w.start()
            return w.address
        finally:
            await w.close()
            await s.close()

    assert asyncio.run(join("127.0.0.2", "127.0.0.1")).startswith("tcp://127.0.0.1:")


def test_the_cli_names_contradicting_address_options() -> None:
    from click.testing import CliRunner

    from shoal.cli import main

    result = CliRunner().invoke(
        main, ["worker", "tcp://127.0.0.1:1", "--host", "127.0.0.1", "--interface", "lo"]
    )
    assert result.exit_code == 2
    assert "give at most one of --host, --interface" in result.output
    result = CliRunner().invoke(
        main, ["worker", "tcp://127.0.0.1:1", "--contact-address", "no-port-here"]
    )
    assert result.exit_code == 2
    assert "--contact-address: not a host:port address" in result.output
