"""Three "hosts" on this machine: Linux network namespaces on a private subnet, each
with its own mount namespace (a tmpfs over /tmp: its own temp and local directories).

Every host's network namespace has a veth pair whose other end is on a bridge in a
fourth, "switch" namespace, so traffic flows only between these namespaces (never
through this machine's own interfaces or firewall). A host keeps its mount namespace
alive with a holder process (``sleep``); every process run on the host enters the
holder's network and mount namespaces with ``nsenter``. ``Network.close`` kills what
it started and deletes the namespaces (their veths and bridge go with them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUBNET = "10.200.14"  # a private test subnet, only inside these namespaces


def unavailable() -> str | None:
    """Why this machine cannot build the hosts (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"no {tool!r} command (Debian: iproute2 / util-linux)"
    probe = f"shoal-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Host:
    def __init__(self, name: str, netns: str, ip: str):
        self.name = name
        self.netns = netns
        self.ip = ip
        self.holder: subprocess.Popen[str] | None = None
        self.processes: list[subprocess.Popen[str]] = []

    def start_holder(self) -> None:
        """The process whose mount namespace (a tmpfs over /tmp) the host's processes share."""
        script = "mount -t tmpfs -o size=1g shoal-host-tmp /tmp && echo ready && exec sleep 86400"
        self.holder = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.netns,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"host {self.name}: could not mount its private /tmp")

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Run ``args`` on this host (its network, its /tmp), from this directory."""
        assert self.holder is not None
        target = str(self.holder.pid)
        command = ["nsenter", "--target", target, "--net", "--mount", f"--wd={os.getcwd()}"]
        proc = subprocess.Popen([*command, "--", *args], text=True, **kwargs)
        self.processes.append(proc)
        return proc

    def tmp(self, pid: int | None = None) -> Path:
        """This host's /tmp as seen from here (through a process in its mount namespace)."""
        assert self.holder is not None
        return Path(f"/proc/{pid or self.holder.pid}/root/tmp")

    def kill_all(self) -> None:
        for proc in [*self.processes, *([self.holder] if self.holder else [])]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr, proc.stdin):
                if stream is not None:
                    stream.close()
        self.processes.clear()


class Network:
    """Hosts ``names`` at SUBNET.1, .2, ...; a context manager that always cleans up."""

    def __init__(self, names: Sequence[str] = ("a", "b", "c")):
        self.prefix = f"shoal{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.hosts = {
            name: Host(name, f"{self.prefix}-{name}", f"{SUBNET}.{i}")
            for i, name in enumerate(names, start=1)
        }
        self._namespaces: list[str] = []

    def __enter__(self) -> Network:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add_netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        _remove_stale_namespaces()
        self._add_netns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for host in self.hosts.values():
            self._add_netns(host.netns)
            port = f"to-{host.name}"
            _ip(
                "-n",
                host.netns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                self.switch,
            )
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", host.netns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            host.start_holder()

    def close(self) -> None:
        for host in self.hosts.values():
            host.kill_all()
        for name in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._namespaces.clear()


def _remove_stale_namespaces() -> None:
    """Namespaces left by a test process that was killed before it could clean up
    (named shoal<pid>-...: that pid is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        owner = name.removeprefix("shoal").partition("-")[0]
        if name.startswith("shoal") and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
