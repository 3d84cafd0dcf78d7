"""Sun/Univa/Son of Grid Engine: ``qsub`` / ``qdel`` / ``qstat``."""

from __future__ import annotations

import os

from shoal.jobqueue._job import ENDED, PENDING, RUNNING, JobSpec, JobSystem
from shoal.jobqueue._options import format_hms


class SGEJob(JobSystem):
    name = "sge"
    directive = "#$"
    submit_command = "qsub"
    cancel_command = "qdel"
    job_id_variable = "${JOB_ID}"
    job_id_regexp = r"Your job (?P<job_id>\d+)"

    def __init__(self, resource_spec: str | None = None, parallel_environment: str | None = None):
        self.resource_spec = resource_spec  # passed to "-l", e.g. "h_vmem=4G,mem_req=4G"
        self.parallel_environment = parallel_environment  # "-pe NAME cores", e.g. "smp"

    def header(self, spec: JobSpec) -> list[str]:
        lines = [f"-N {spec.job_name}"]
        if spec.queue:
            lines.append(f"-q {spec.queue}")
        if spec.account:
            lines.append(f"-P {spec.account}")
        if self.parallel_environment:
            lines.append(f"-pe {self.parallel_environment} {spec.cores}")
        if self.resource_spec:
            lines.append(f"-l {self.resource_spec}")
        if spec.walltime is not None:
            lines.append(f"-l h_rt={format_hms(spec.walltime)}")
        lines += [f"-o {spec.log_directory}/", "-j y", "-cwd", "-V", "-S /bin/bash"]
        return [f"{self.directive} {line}" for line in lines]

    def log_path(self, spec: JobSpec, job_id: str) -> str:
        return os.path.join(spec.log_directory, f"{spec.job_name}.o{job_id}")

    def status_args(self, user: str) -> list[str]:
        return ["qstat", "-u", user]

    def parse_status(self, output: str) -> dict[str, str]:
        """qstat's table: job-ID prior name user state ...; state letters such as
        ``qw`` (waiting), ``hqw`` (held), ``r`` / ``t`` / ``s`` (running, moving,
        suspended), ``dr`` (being deleted), any ``E`` (error: never runs)."""
        states = {}
        for line in output.splitlines():
            parts = line.split()
            if len(parts) < 5 or not parts[0].isdigit():
                continue
            code = parts[4]
            if "d" in code or "E" in code:
                states[parts[0]] = ENDED
            elif "q" in code:
                states[parts[0]] = PENDING
            else:
                states[parts[0]] = RUNNING
        return states
