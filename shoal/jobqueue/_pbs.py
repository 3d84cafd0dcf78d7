"""PBS / Torque / OpenPBS: ``qsub`` / ``qdel`` / ``qstat``."""

from __future__ import annotations

import math
import os

from shoal.jobqueue._job import ENDED, PENDING, RUNNING, JobSpec, JobSystem
from shoal.jobqueue._options import format_hms


class PBSJob(JobSystem):
    name = "pbs"
    directive = "#PBS"
    submit_command = "qsub"
    cancel_command = "qdel"
    # qsub prints "123.server"; inside the job PBS_JOBID is the same: names use the number
    job_id_variable = "${PBS_JOBID%%.*}"
    job_id_regexp = r"(?P<job_id>\d+)"

    def __init__(self, resource_spec: str | None = None):
        self.resource_spec = resource_spec  # "-l" instead of "select=1:ncpus=..:mem=.."

    def header(self, spec: JobSpec) -> list[str]:
        lines = [f"-N {spec.job_name}"]
        if spec.queue:
            lines.append(f"-q {spec.queue}")
        if spec.account:
            lines.append(f"-A {spec.account}")
        resources = self.resource_spec or (
            f"select=1:ncpus={spec.cores}:mem={pbs_memory(spec.memory)}"
        )
        lines.append(f"-l {resources}")
        if spec.walltime is not None:
            lines.append(f"-l walltime={format_hms(spec.walltime)}")
        lines += [f"-o {spec.log_directory}/", "-j oe", "-V"]
        return [f"{self.directive} {line}" for line in lines]

    def log_path(self, spec: JobSpec, job_id: str) -> str:
        return os.path.join(spec.log_directory, f"{spec.job_name}.o{job_id}")

    def status_args(self, user: str) -> list[str]:
        return ["qstat", "-u", user]

    def parse_status(self, output: str) -> dict[str, str]:
        """``qstat -u``'s table: the id first (``123.server``), the state letter in the
        second-to-last column: Q/H/W/T waiting, R/S/U/B running, E/F/C/X ending or over."""
        states = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) < 3 or not parts[0][:1].isdigit():
                continue
            job_id = parts[0].split(".")[0]
            code = parts[-2]
            if code in ("Q", "H", "W", "T"):
                states[job_id] = PENDING
            elif code in ("R", "S", "U", "B"):
                states[job_id] = RUNNING
            else:
                states[job_id] = ENDED
        return states


def pbs_memory(nbytes: int) -> str:
    """PBS memory in whole MB, rounded up."""
    return f"{max(1, math.ceil(nbytes / 10**6))}MB"
