"""SLURM: ``sbatch`` / ``scancel`` / ``squeue``."""

from __future__ import annotations

import math
import os

from shoal.jobqueue._job import ENDED, PENDING, RUNNING, JobSpec, JobSystem
from shoal.jobqueue._options import format_hms

# squeue's states (long form); any other (COMPLETING, CANCELLED, TIMEOUT, ...) is over.
_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"}


class SLURMJob(JobSystem):
    name = "slurm"
    directive = "#SBATCH"
    submit_command = "sbatch"
    cancel_command = "scancel"
    job_id_variable = "${SLURM_JOB_ID}"

    def header(self, spec: JobSpec) -> list[str]:
        lines = [
            f"-J {spec.job_name}",
            f"-o {os.path.join(spec.log_directory, spec.job_name)}-%j.out",
            "-n 1",
            f"--cpus-per-task={spec.cores}",
            f"--mem={slurm_memory(spec.memory)}",
        ]
        if spec.walltime is not None:
            lines.append(f"-t {format_hms(spec.walltime)}")
        if spec.queue:
            lines.append(f"-p {spec.queue}")
        if spec.account:
            lines.append(f"-A {spec.account}")
        return [f"{self.directive} {line}" for line in lines]

    def log_path(self, spec: JobSpec, job_id: str) -> str:
        return os.path.join(spec.log_directory, f"{spec.job_name}-{job_id}.out")

    def submit_args(self) -> list[str]:
        return ["sbatch", "--parsable"]  # prints "ID" or "ID;cluster"

    def status_args(self, user: str) -> list[str]:
        return ["squeue", "--noheader", "--user", user, "--format", "%i %T"]

    def parse_status(self, output: str) -> dict[str, str]:
        states = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                state = parts[1].upper()
                states[parts[0]] = (
                    PENDING if state in _PENDING else RUNNING if state in _RUNNING else ENDED
                )
        return states


def slurm_memory(nbytes: int) -> str:
    """``--mem`` in whole MiB, rounded up (``"954M"`` for 1GB): never less than asked."""
    return f"{max(1, math.ceil(nbytes / 2**20))}M"
