"""What every queue system's job has in common: the job script around the worker
command, and the commands that submit, cancel and list jobs.

A queue system is a small subclass of :class:`JobSystem` (``_slurm``, ``_sge``,
``_pbs``): its directives, its submit/cancel/status commands and how to read their
output. Everything here is pure text: running the commands is the tracker's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from typing import ClassVar

PENDING = "pending"
RUNNING = "running"
ENDED = "ended"


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job's shape, as the cluster's options give it."""

    job_name: str
    cores: int
    memory: int  # bytes, the whole job's
    processes: int  # workers per job
    walltime: int | None  # seconds
    queue: str | None
    account: str | None
    log_directory: str
    job_extra_directives: tuple[str, ...]
    job_script_prologue: tuple[str, ...]
    python: str
    scheduler_address: str
    interface: str | None
    local_directory: str | None
    lifetime: tuple[int, int] | None  # (lifetime, stagger) seconds, or no lifetime
    nanny: bool
    worker_extra_args: tuple[str, ...]

    @property
    def threads_per_worker(self) -> int:
        return max(1, self.cores // self.processes)

    @property
    def memory_per_worker(self) -> int:
        return self.memory // self.processes


class JobSystem:
    """A queue system's conventions (see the module doc)."""

    name: ClassVar[str]
    directive: ClassVar[str]  # e.g. "#SBATCH"
    submit_command: ClassVar[str]
    cancel_command: ClassVar[str]
    job_id_variable: ClassVar[str]  # the shell expression for the job's id inside the job
    job_id_regexp: ClassVar[str] = r"(?P<job_id>\d+)"

    def header(self, spec: JobSpec) -> list[str]:
        """The directives (without the extra ones), each a line."""
        raise NotImplementedError

    def log_path(self, spec: JobSpec, job_id: str) -> str:
        """Where the job's output (the worker's log) goes."""
        raise NotImplementedError

    def submit_args(self) -> list[str]:
        """The submit command; the script comes on its standard input."""
        return [self.submit_command]

    def cancel_args(self, job_ids: list[str]) -> list[str]:
        return [self.cancel_command, *job_ids]

    def status_args(self, user: str) -> list[str]:
        raise NotImplementedError

    def parse_status(self, output: str) -> dict[str, str]:
        """Job id -> PENDING / RUNNING / ENDED for each job listed."""
        raise NotImplementedError

    def parse_job_id(self, output: str) -> str:
        match = re.search(self.job_id_regexp, output)
        if match is None:
            raise RuntimeError(
                f"could not read a job id in {self.submit_command}'s output: {output.strip()!r}"
            )
        return match.group("job_id")

    # ------------------------------------------------------------------ the script

    def job_script(self, spec: JobSpec) -> str:
        lines = ["#!/usr/bin/env bash", ""]
        lines += self.header(spec)
        lines += [f"{self.directive} {d}" for d in spec.job_extra_directives]
        lines.append("")
        lines += spec.job_script_prologue
        lines += self.worker_commands(spec)
        return "\n".join(lines) + "\n"

    def worker_name(self, spec: JobSpec, job_id: str, index: int) -> str:
        """The name of worker ``index`` of job ``job_id``: it names its job."""
        return f"{spec.job_name}-{job_id}-{index}"

    def worker_commands(self, spec: JobSpec) -> list[str]:
        """Find the address this node reaches the scheduler from (or ``interface``'s),
        then one worker per process; the job lasts as long as its workers."""
        python = shlex.quote(spec.python)
        lines = [f"SHOAL_WORKER_HOST=$({python} -c {shlex.quote(_host_snippet(spec))})"]
        commands = []
        for index in range(spec.processes):
            name = f"{spec.job_name}-{self.job_id_variable}-{index}"
            commands.append(
                " ".join([python, "-m", "shoal", "worker", *self.worker_args(spec, name)])
            )
        if spec.processes == 1:
            lines.append(f"exec {commands[0]}")
        else:
            lines += [f"{c} &" for c in commands]
            lines.append("wait")
        return lines

    def worker_args(self, spec: JobSpec, name: str) -> list[str]:
        args = [
            shlex.quote(spec.scheduler_address),
            "--name",
            f'"{name}"',
            "--host",
            '"$SHOAL_WORKER_HOST"',
            "--nthreads",
            str(spec.threads_per_worker),
            "--memory-limit",
            str(spec.memory_per_worker),
            "--nanny" if spec.nanny else "--no-nanny",
        ]
        if spec.lifetime is not None:
            lifetime, stagger = spec.lifetime
            args += ["--lifetime", f"{lifetime}s", "--lifetime-stagger", f"{stagger}s"]
            args.append("--no-lifetime-restart")
        if spec.local_directory:
            args += ["--local-directory", shlex.quote(spec.local_directory)]
        args += [shlex.quote(a) for a in spec.worker_extra_args]
        return args


def _host_snippet(spec: JobSpec) -> str:
    """Python printing the address this worker listens on: ``interface``'s IPv4 address,
    or the one this node reaches the scheduler from (a UDP connect sends nothing)."""
    if spec.interface:
        return (
            "import psutil, socket; "
            f"print(next(a.address for a in psutil.net_if_addrs()[{json.dumps(spec.interface)}] "
            "if a.family == socket.AF_INET))"
        )
    host = spec.scheduler_address.rpartition("://")[2].rpartition(":")[0].strip("[]")
    return (
        "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"s.connect(({json.dumps(host)}, 9)); print(s.getsockname()[0])"
    )
