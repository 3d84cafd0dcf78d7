"""``benchmarks/profile_interactive.py`` at a tiny size, and its message trace.

The script runs in a subprocess (it starts a cluster and installs signal handlers of
its own); the trace statistics are checked on a hand-made trace.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from benchmark_script import ROOT, run_script

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import message_trace  # noqa: E402
from benchmarks.profile_interactive import PHASES, trace_stats  # noqa: E402


def _rows(out: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table whose header starts with ``header``, by cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.timeout(240)
def test_profile_interactive_tiny(tmp_path: Path) -> None:
    raw = tmp_path / "raw.json"
    trace = tmp_path / "trace"
    proc = run_script(
        "profile_interactive.py",
        [
            "--cells", "delayed,sum",
            "--repeats", "2",
            "--rows", "2000",
            "--json", str(raw),
            "--trace", str(trace),
            "--trace-repeats", "1",
            "--trace-via", "get",  # the notebook's path: the client as Dask's scheduler
            "--experiments",
        ],
        timeout=200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "delayed: done" in proc.stderr and "sum: done" in proc.stderr  # progress, by cell
    out = proc.stdout

    phases = _rows(out, "| cell | tasks |")
    assert set(phases) == {"delayed", "sum"}
    delayed, total = phases["delayed"], phases["sum"]
    assert delayed[0] == "1"  # one task: sum([1, 2, 3])
    assert int(total[0]) >= 5  # 4 partitions and a reduction at least
    for row in (delayed, total):
        sync_ms, shoal_ms = float(row[1]), float(row[2])
        assert 0 < sync_ms < 5_000 and 0 < shoal_ms < 5_000
        phase_ms = [float(x) for x in row[4 : 4 + len(PHASES)]]
        assert all(x >= 0 for x in phase_ms)
        assert float(row[4 + len(PHASES)]) == pytest.approx(sum(phase_ms), abs=0.2)
        run_ms = phase_ms[PHASES.index("run")]
        assert run_ms > 0  # the cluster really ran something

    cpu = _rows(out, "| cell | sync ms | client CPU ms |")
    assert set(cpu) == {"delayed", "sum"}
    # 13 tasks on two workers: above what the processes spend idle (taken off)
    client_ms, scheduler_ms, workers_ms = map(float, cpu["sum"][1:4])
    assert 0 < client_ms < 1_000 and 0 < scheduler_ms < 1_000 and 0 < workers_ms < 1_000
    assert re.search(r"Idle CPU taken off \(ms per s\): client [\d.]+, scheduler", out)

    pairs = _rows(out, "| pair |")
    assert set(pairs) == {
        "result np.float64 vs float",
        "df.b.sum(): data in graph vs persisted",
        "df.b.sum(): unfused vs fused",
    }
    for base_ms, lean_ms, difference_ms in ([float(x) for x in row] for row in pairs.values()):
        assert 0 < base_ms < 5_000 and 0 < lean_ms < 5_000
        assert difference_ms == pytest.approx(base_ms - lean_ms, abs=0.011)

    saved = json.loads(raw.read_text())
    assert [r["name"] for r in saved] == ["delayed", "sum"]
    assert all(len(r["shoal"]) == 2 and len(r["sync"]) == 2 for r in saved)
    assert all(x > 0 for r in saved for x in r["cpu"]["scheduler"])

    # The trace: every process wrote one, and one compute of each cell is shown with
    # the messages of the whole round trip.
    assert len(list(trace.glob("trace-*.jsonl"))) >= 4  # client, scheduler, 2 workers
    section = out[out.index("### delayed: one compute") :]
    section = section[: section.index("### sum: one compute")]
    for step in (
        r"client -> scheduler\s+SubmitTasks\(tasks=1",
        r"scheduler -> worker-\d+\s+.*ComputeTask\(sum-",
        r"worker-\d+ -> scheduler\s+TaskFinished\(sum-",
        r"scheduler -> client\s+KeyInMemory\(sum-",
    ):
        assert re.search(step, section), f"{step!r} not in\n{section}"
    assert "| wire (frame out -> dispatched at the peer) |" in out


def _line(t: float, role: str, pid: int, direction: str, msgs: list[dict]) -> dict:
    return {"t": t, "role": role, "pid": pid, "dir": direction, "local": "", "peer": "",
            "msgs": msgs}  # fmt: skip


def test_trace_stats_on_a_known_trace() -> None:
    """One task on a one-thread worker behind another: each hop's length is known."""
    task = {"type": "ComputeTask", "key": "a"}
    task_b = {"type": "ComputeTask", "key": "b"}
    lines = [
        _line(1.000, "client", 1, "out", [{"type": "SubmitTasks", "tasks": 2}]),
        _line(1.001, "scheduler", 2, "in", [{"type": "SubmitTasks", "tasks": 2}]),
        _line(1.002, "scheduler", 2, "out", [task, task_b]),
        _line(1.003, "worker", 3, "in", [task, task_b]),
        # a runs 1.004..1.010, b waits and runs 1.012..1.013
        _line(1.011, "worker", 3, "out",
              [{"type": "TaskFinished", "key": "a", "start": 1.004, "stop": 1.010}]),
        _line(1.0115, "scheduler", 2, "in",
              [{"type": "TaskFinished", "key": "a", "start": 1.004, "stop": 1.010}]),
        _line(1.0125, "scheduler", 2, "out", [{"type": "ComputeTask", "key": "c"}]),
        _line(1.014, "worker", 3, "out",
              [{"type": "TaskFinished", "key": "b", "start": 1.012, "stop": 1.013}]),
    ]  # fmt: skip
    stats = trace_stats(lines)
    med = {name: round(value[0], 3) for name, value in stats.items()}
    assert med["worker: ComputeTask in -> task start"] == pytest.approx(5.0)  # 1 and 9
    assert stats["worker: ComputeTask in -> task start"][2] == 2
    assert med["worker: task stop -> TaskFinished out"] == pytest.approx(1.0)  # 1 and 1
    assert med["worker: task stop -> next task start (next one waiting)"] == pytest.approx(2.0)
    assert med["scheduler: TaskFinished in -> next ComputeTask out"] == pytest.approx(1.0)
    # SubmitTasks 1 ms, ComputeTask a/b 1 ms each, TaskFinished a 0.5 ms
    assert stats["wire (frame out -> dispatched at the peer)"][2] == 4


def test_trace_files_are_read_in_time_order(tmp_path: Path) -> None:
    (tmp_path / "trace-2.jsonl").write_text(json.dumps(_line(2.0, "worker", 2, "in", [])) + "\n")
    (tmp_path / "trace-1.jsonl").write_text(
        json.dumps(_line(3.0, "client", 1, "out", []))
        + "\n"
        + json.dumps(_line(1.0, "client", 1, "in", []))
        + "\n"
    )
    assert [x["t"] for x in message_trace.read_trace(tmp_path)] == [1.0, 2.0, 3.0]
    assert message_trace.role_of(["/x/benchmarks/profile_interactive.py", "--cells"]) == "client"
    assert message_trace.role_of(["/x/shoal/__main__.py", "worker", "--nthreads"]) == "worker"
