"""Job scripts and queue commands for SLURM, SGE and PBS, without a queue system:
directives, the worker command, walltime/memory parsing, reading submit and status
output, and the errors for bad options."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from shoal.jobqueue import JobCommandError, PBSCluster, SGECluster, SLURMCluster
from shoal.jobqueue._job import ENDED, PENDING, RUNNING
from shoal.jobqueue._options import format_hms, parse_memory, parse_walltime, worker_lifetime
from shoal.jobqueue._pbs import PBSJob
from shoal.jobqueue._sge import SGEJob
from shoal.jobqueue._slurm import SLURMJob, slurm_memory

pytestmark = pytest.mark.timeout(60)


def worker_lines(script: str) -> list[list[str]]:
    """The ``shoal worker`` commands of a script, split as the shell would (roughly)."""
    return [
        shlex.split(line.removeprefix("exec ").removesuffix(" &"))
        for line in script.splitlines()
        if " -m shoal worker " in line
    ]


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.fixture
def slurm_cluster(tmp_path):
    clusters = []

    def make(**kwargs):
        kwargs.setdefault("cores", 1)
        kwargs.setdefault("memory", "1GB")
        c = SLURMCluster(interface="lo", log_directory=str(tmp_path), **kwargs)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        c.close()


def test_slurm_script_directives_and_worker_command(slurm_cluster, tmp_path):
    cluster = slurm_cluster(
        cores=4,
        memory="8GB",
        queue="gpu",
        account="physics",
        walltime="01:00:00",
        job_extra_directives=["--exclusive", "--gres=gpu:1"],
        job_script_prologue=["module load python", "source env/bin/activate"],
        local_directory="/scratch/me",
        worker_extra_args=["--resources", "GPU=1"],
        python="/opt/py/bin/python3",
        job_name="analysis",
    )
    script = cluster.job_script()
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH -J analysis",
        f"#SBATCH -o {tmp_path}/analysis-%j.out",
        "#SBATCH -n 1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=7630M",  # 8e9 bytes in MiB, rounded up
        "#SBATCH -t 01:00:00",
        "#SBATCH -p gpu",
        "#SBATCH -A physics",
        "#SBATCH --exclusive",
        "#SBATCH --gres=gpu:1",
    ]
    # the prologue runs before the worker, after the directives
    assert lines.index("module load python") > lines.index("#SBATCH --gres=gpu:1")
    assert lines.index("source env/bin/activate") < next(
        i for i, line in enumerate(lines) if " -m shoal worker " in line
    )
    [args] = worker_lines(script)
    assert args[:4] == ["/opt/py/bin/python3", "-m", "shoal", "worker"]
    assert args[4] == cluster.scheduler_address
    assert option(args, "--name") == "analysis-${SLURM_JOB_ID}-0"
    assert option(args, "--nthreads") == "4"
    assert option(args, "--memory-limit") == "8000000000"
    assert "--nanny" in args
    # one hour: a margin of 5 min (10%, at most 5 min) and a stagger of 3 min (5%)
    assert option(args, "--lifetime") == f"{3600 - 300 - 180}s"
    assert option(args, "--lifetime-stagger") == "180s"
    assert "--no-lifetime-restart" in args
    assert option(args, "--local-directory") == "/scratch/me"
    assert args[-2:] == ["--resources", "GPU=1"]
    # the token reaches jobs through the submit command's environment, never the script
    assert cluster.security.token and cluster.security.token not in script
    assert script.startswith("#!") and "exec " in script  # one process: the job is the worker


def test_several_processes_per_job(slurm_cluster):
    cluster = slurm_cluster(cores=6, memory="6GB", processes=3)
    script = cluster.job_script()
    workers = worker_lines(script)
    assert [option(a, "--name") for a in workers] == [
        f"shoal-worker-${{SLURM_JOB_ID}}-{i}" for i in range(3)
    ]
    assert {option(a, "--nthreads") for a in workers} == {"2"}
    assert {option(a, "--memory-limit") for a in workers} == {"2000000000"}
    assert "#SBATCH --cpus-per-task=6" in script
    assert sum(line.endswith(" &") for line in script.splitlines()) == 3
    assert script.rstrip().endswith("wait")  # the job lasts as long as its workers


def test_no_walltime_or_no_lifetime(slurm_cluster):
    no_walltime = slurm_cluster(walltime=None).job_script()
    assert "-t " not in no_walltime and "--lifetime" not in no_walltime
    no_lifetime = slurm_cluster(walltime="00:10:00", worker_lifetime=False).job_script()
    assert "#SBATCH -t 00:10:00" in no_lifetime and "--lifetime" not in no_lifetime


def test_worker_host_is_found_on_the_node(slurm_cluster):
    """The job finds its address on the node: ``interface``'s, else the one it reaches
    the scheduler from. Run the script's line here to see it print an address."""
    import subprocess

    for kwargs in ({}, {"job_name": "x"}):
        script = slurm_cluster(**kwargs).job_script()
        line = next(line for line in script.splitlines() if line.startswith("SHOAL_WORKER_HOST="))
        out = subprocess.run(
            ["bash", "-c", f"{line}\necho $SHOAL_WORKER_HOST"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.stdout.strip() == "127.0.0.1", out.stderr


def test_lifetime_leaves_before_the_walltime():
    for walltime in (60, 120, 1800, 3600, 86400):
        lifetime, stagger = worker_lifetime(walltime)
        margin = min(max(walltime * 0.1, 10), 300)
        assert lifetime + stagger <= walltime - margin  # even the latest leaves in time
        assert lifetime - stagger > 0
    assert worker_lifetime(3600, "10m", "2m") == (3600 - 600 - 120, 120)
    assert worker_lifetime(600, 30, 0) == (570, 0)
    with pytest.raises(ValueError, match="too short"):
        worker_lifetime(60, "50s", "10s")
    with pytest.raises(ValueError, match="lifetime_margin"):
        worker_lifetime(600, "soon")


def test_walltime_and_memory_parsing():
    assert parse_walltime("00:30:00") == 1800
    assert parse_walltime("48:00:00") == 48 * 3600
    assert parse_walltime("1-02:03:04") == 86400 + 2 * 3600 + 3 * 60 + 4
    assert format_hms(86400 + 2 * 3600 + 3 * 60 + 4) == "26:03:04"
    for bad in ("2h", "30", "00:60:00", "00:00:61", "1:2", "", "00:00:00", 3600, None):
        with pytest.raises(ValueError, match="walltime"):
            parse_walltime(bad)
    assert parse_memory("1GB") == 10**9
    assert parse_memory("4GiB") == 4 * 2**30
    assert parse_memory("2e9") == 2 * 10**9
    assert parse_memory(123456) == 123456
    for bad in ("lots", "1 parsec", "-1GB", 0, "", None, True):
        with pytest.raises(ValueError, match="memory"):
            parse_memory(bad)
    assert slurm_memory(10**9) == "954M"
    assert slurm_memory(1) == "1M"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"walltime": "2 hours"}, "walltime must be 'HH:MM:SS'"),
        ({"walltime": "00:75:00"}, "minutes and seconds must be below 60"),
        ({"memory": "plenty"}, "memory must be an amount such as '1GB'"),
        ({"cores": 0}, "cores must be an integer >= 1"),
        ({"cores": 2, "processes": 3}, r"processes \(3\) cannot exceed cores \(2\)"),
        ({"job_extra_directives": "--exclusive"}, "must be a list of strings"),
        ({"worker_extra_args": [1]}, "must be a list of strings"),
        ({"walltime": "00:00:10"}, "too short for a lifetime margin"),
        ({"lifetime_stagger": "-1s"}, "lifetime_stagger must be a duration"),
        ({"job_name": "my job"}, "job_name must be a non-empty word"),
        ({"interface": "nosuch0"}, "interface 'nosuch0' is not one of this machine's"),
        ({"poll_interval": "often"}, "poll_interval must be a duration"),
    ],
)
def test_bad_options_are_named(kwargs, message, tmp_path):
    args = {"cores": 1, "memory": "1GB", "interface": "lo", "log_directory": str(tmp_path)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        SLURMCluster(**args)


def test_missing_submit_command_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch anywhere
    with SLURMCluster(cores=1, memory="1GB", interface="lo", log_directory=str(tmp_path)) as c:
        with pytest.raises(JobCommandError, match="'sbatch' was not found.*slurm client"):
            c.scale(1)
        assert c.jobs == {} and c.jobs_submitted == 0


def test_scale_and_adapt_arguments(slurm_cluster):
    cluster = slurm_cluster(cores=2, processes=2)
    with pytest.raises(ValueError, match="either n .workers. or jobs"):
        cluster.scale(2, jobs=1)
    with pytest.raises(ValueError, match="either n"):
        cluster.scale()
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        cluster.scale(jobs=-1)
    with pytest.raises(ValueError, match="minimum_jobs must be an integer >= 0"):
        cluster.adapt(minimum_jobs=-1)
    adaptive = cluster.adapt(minimum_jobs=1, maximum_jobs=3)
    assert (adaptive.minimum, adaptive.maximum) == (2, 6)  # workers: 2 per job
    adaptive.stop()


def test_sge_script_and_commands(tmp_path):
    with SGECluster(
        cores=4,
        memory="4GB",
        queue="all.q",
        account="proj",
        walltime="02:00:00",
        resource_spec="h_vmem=1G",
        parallel_environment="smp",
        job_extra_directives=["-m n"],
        interface="lo",
        log_directory=str(tmp_path),
    ) as cluster:
        script = cluster.job_script()
    directives = [line for line in script.splitlines() if line.startswith("#$")]
    assert directives == [
        "#$ -N shoal-worker",
        "#$ -q all.q",
        "#$ -P proj",
        "#$ -pe smp 4",
        "#$ -l h_vmem=1G",
        "#$ -l h_rt=02:00:00",
        f"#$ -o {tmp_path}/",
        "#$ -j y",
        "#$ -cwd",
        "#$ -V",  # the submitting environment (and its token) goes to the job
        "#$ -S /bin/bash",
        "#$ -m n",
    ]
    [args] = worker_lines(script)
    assert option(args, "--name") == "shoal-worker-${JOB_ID}-0"
    assert option(args, "--lifetime") == f"{7200 - 300 - 240}s"
    job = SGEJob()
    assert job.parse_job_id('Your job 4321 ("shoal-worker") has been submitted\n') == "4321"
    with pytest.raises(RuntimeError, match="could not read a job id in qsub's output"):
        job.parse_job_id("Unable to run job: denied")
    qstat = """\
job-ID  prior   name       user         state submit/start at     queue       slots ja-task-ID
-----------------------------------------------------------------------------------------------
      7 0.55500 shoal-work root         r     11/24/2026 06:55:36 all.q@vm        1
      8 0.00000 shoal-work root         qw    11/24/2026 06:55:40                 1
      9 0.00000 shoal-work root         Eqw   11/24/2026 06:55:41                 1
     10 0.55500 shoal-work root         dr    11/24/2026 06:55:36 all.q@vm        1
"""
    assert job.parse_status(qstat) == {"7": RUNNING, "8": PENDING, "9": ENDED, "10": ENDED}
    assert job.log_path(cluster._tracker.spec, "7") == f"{tmp_path}/shoal-worker.o7"


def test_pbs_script_and_commands(tmp_path):
    with PBSCluster(
        cores=8,
        memory="16GB",
        processes=2,
        queue="workq",
        account="acc",
        walltime="00:30:00",
        interface="lo",
        log_directory=str(tmp_path),
    ) as cluster:
        script = cluster.job_script()
    directives = [line for line in script.splitlines() if line.startswith("#PBS")]
    assert directives == [
        "#PBS -N shoal-worker",
        "#PBS -q workq",
        "#PBS -A acc",
        "#PBS -l select=1:ncpus=8:mem=16000MB",
        "#PBS -l walltime=00:30:00",
        f"#PBS -o {tmp_path}/",
        "#PBS -j oe",
        "#PBS -V",
    ]
    workers = worker_lines(script)
    assert [option(a, "--name") for a in workers] == [
        "shoal-worker-${PBS_JOBID%%.*}-0",
        "shoal-worker-${PBS_JOBID%%.*}-1",
    ]
    assert {option(a, "--nthreads") for a in workers} == {"4"}
    job = PBSJob()
    assert job.parse_job_id("1234.pbs-server\n") == "1234"
    qstat = """\
pbs-server:
                                                            Req'd  Req'd   Elap
Job ID          Username Queue    Jobname    SessID NDS TSK Memory Time  S Time
--------------- -------- -------- ---------- ------ --- --- ------ ----- - -----
1234.pbs-server root     workq    shoal-work  12345   1   8   16gb 00:30 R 00:01
1235.pbs-server root     workq    shoal-work    --    1   8   16gb 00:30 Q   --
1236.pbs-server root     workq    shoal-work  12346   1   8   16gb 00:30 E 00:29
"""
    assert job.parse_status(qstat) == {"1234": RUNNING, "1235": PENDING, "1236": ENDED}
    assert re.fullmatch(r"#PBS -l select=1:ncpus=8:mem=16000MB", directives[3])
    with PBSCluster(
        cores=1,
        memory="1GB",
        resource_spec="nodes=1:ppn=1",
        interface="lo",
        log_directory=str(tmp_path),
    ) as custom:
        assert "#PBS -l nodes=1:ppn=1" in custom.job_script()


def test_slurm_status_parsing():
    out = "11 RUNNING\n12 PENDING\n13 COMPLETING\n14 CONFIGURING\n15 TIMEOUT\n"
    assert SLURMJob().parse_status(out) == {
        "11": RUNNING,
        "12": PENDING,
        "13": ENDED,
        "14": PENDING,
        "15": ENDED,
    }
    assert SLURMJob().parse_job_id("42;cluster\n") == "42"
    assert sys.executable  # the default python is this interpreter
