"""Which address a worker listens on and which it advertises (Dask's meanings).

- default: the local address of the route to the scheduler, so a worker of a
  scheduler on another host advertises an address that host can reach (one on
  loopback stays on loopback);
- ``host``: listen there and advertise it (``0.0.0.0``/``::``: every interface,
  advertising the route to the scheduler);
- ``interface``: the IPv4 (else IPv6) address of that network interface, e.g. ``eth0``;
- ``listen_address``: bind exactly there (e.g. ``tcp://0.0.0.0:8000`` in a container);
- ``contact_address``: advertise exactly this (the address through NAT or a port
  forward); the worker listens per the options above, on every interface by default.

The scheduler refuses a worker that advertises loopback while it was itself reached
over another interface: its peers and clients could never reach that worker.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import psutil

from shoal.comm.tcp import format_address, split_address

WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class WorkerAddressOptions:
    host: str | None = None
    port: int = 0
    interface: str | None = None
    listen_address: str | None = None
    contact_address: str | None = None

    def check(self) -> WorkerAddressOptions:
        """Itself; a ValueError naming the options that contradict each other or the
        address that does not parse."""
        given = [
            name
            for name, value in (
                ("--host", self.host),
                ("--interface", self.interface),
                ("--listen-address", self.listen_address),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(given)}: each says where to listen")
        if self.listen_address is not None and self.port:
            raise ValueError("--listen-address carries its port: do not give --port as well")
        for option, address in (
            ("--listen-address", self.listen_address),
            ("--contact-address", self.contact_address),
        ):
            if address is not None:
                try:
                    split_address(address)
                except ValueError as e:
                    raise ValueError(f"{option}: {e}") from None
        if self.interface is not None:
            interface_address(self.interface)
        return self

    def listen_on(self, scheduler_address: str) -> tuple[str, int]:
        """The host and port to bind."""
        if self.listen_address is not None:
            _, host, port = split_address(self.listen_address)
            return host, port
        if self.interface is not None:
            return interface_address(self.interface), self.port
        if self.host is not None:
            return self.host, self.port
        if self.contact_address is not None:  # reached through NAT: on every interface
            return "0.0.0.0", self.port
        return route_to(scheduler_address), self.port

    def advertise(self, listening: str, scheduler_address: str) -> str:
        """The address peers and clients are told, given the one we listen on."""
        if self.contact_address is not None:
            return self.contact_address
        scheme, host, port = split_address(listening)
        if host in WILDCARDS:
            host = route_to(scheduler_address)
        return format_address(host, port, scheme)


def route_to(address: str) -> str:
    """The local address this host uses to reach ``address``'s host (the kernel's route:
    a UDP socket's connect sends nothing)."""
    _, host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return str(sock.getsockname()[0])
    except OSError as e:
        raise OSError(f"no route from this host to the scheduler at {address}: {e}") from e


def interface_address(name: str) -> str:
    """The IPv4 (else IPv6) address of network interface ``name``."""
    interfaces = psutil.net_if_addrs()
    if name not in interfaces:
        known = ", ".join(sorted(interfaces))
        raise ValueError(f"--interface: no network interface {name!r} here (there are {known})")
    for family in (socket.AF_INET, socket.AF_INET6):
        for entry in interfaces[name]:
            if entry.family == family:
                return str(entry.address).partition("%")[0]  # fe80::1%eth0 -> fe80::1
    raise ValueError(f"--interface: network interface {name!r} has no IP address")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: not ours to resolve here
        return False


def unreachable_advertisement(advertised: str, reached_on: str | None) -> str | None:
    """Why a worker advertising ``advertised`` cannot be used by a scheduler it reached
    on local host ``reached_on`` (None: it can)."""
    if reached_on is None or is_loopback(reached_on):
        return None
    _, host, _ = split_address(advertised)
    if not is_loopback(host):
        return None
    return (
        f"the worker advertises the loopback address {advertised} but reached this "
        f"scheduler over {reached_on}: other hosts could never reach it. Start it with "
        "--host, --interface or --contact-address giving an address they can reach "
        "(by default it advertises its side of the route to the scheduler)"
    )


def advertised_listener(listening: str) -> str:
    """A scheduler listening on every interface (``--host 0.0.0.0``) advertises this
    host's first non-loopback address that is up, rather than the wildcard nobody can
    connect to; anything else as it is."""
    scheme, host, port = split_address(listening)
    if host not in WILDCARDS:
        return listening
    family = socket.AF_INET6 if host == "::" else socket.AF_INET
    stats = psutil.net_if_stats()
    for name, entries in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for entry in entries:
            if entry.family == family and not is_loopback(entry.address.partition("%")[0]):
                return format_address(entry.address.partition("%")[0], port, scheme)
    return format_address("127.0.0.1" if family == socket.AF_INET else "::1", port, scheme)
