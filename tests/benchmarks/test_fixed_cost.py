"""``benchmarks/fixed_cost.py``: its timeline on hand-made stamps, and a tiny run."""

from __future__ import annotations

import sys

import pytest
from benchmark_script import ROOT, run_script

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fixed_cost import timeline  # noqa: E402


def test_timeline_medians_per_point_in_time_order() -> None:
    events = []
    for i, (sent, ran) in enumerate([(1.0, 2.0), (1.5, 3.0), (2.0, 4.0)]):
        t0 = 100.0 * i
        events += [
            (t0, "client", "compute0"),
            (t0 + sent / 1e3, "client", "wr0"),
            (t0 + ran / 1e3, "worker-7", "run0"),
            (t0 + (ran + 1) / 1e3, "client", "wr0"),  # a second write of the same compute
            (t0 + 9 / 1e3, "client", "compute1"),
            (t0 + 10 / 1e3, "client", "wr0"),  # after compute() returned: not counted
        ]
    events.sort()
    rows = timeline(events, skip=0)
    points = [point for _, _, point, _ in rows]
    assert points == [
        "client: compute0",
        "client: wr0",
        "worker0: run0",
        "client: wr0 #2",
        "client: compute1",
    ]
    by_point = {point: (at, step, n) for at, step, point, n in rows}
    assert by_point["client: wr0"] == pytest.approx((1.5, 1.5, 3))
    assert by_point["worker0: run0"] == pytest.approx((3.0, 1.5, 3))
    assert by_point["client: compute1"][0] == pytest.approx(9.0)


@pytest.mark.timeout(240)
def test_fixed_cost_tiny() -> None:
    proc = run_script(
        "fixed_cost.py", ["--computes", "12", "--pause", "0.01", "--hot"], timeout=200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for point in (
        "client: compute0",
        "client: get0",
        "scheduler: in SubmitTasks",
        "run0",
        "scheduler: in TaskFinished",
        "client: in KeyInMemory",
        "client: woke",
        "client: compute1",
        "scheduler core: a one-task SubmitTasks",
        "KeyInMemory frame decoded",
    ):
        assert point in proc.stdout, (point, proc.stdout)
