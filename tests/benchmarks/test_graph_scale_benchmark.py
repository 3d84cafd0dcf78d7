"""``benchmarks/graph_scale.py`` at a tiny size (2k tasks) on real shoal and Dask
clusters: the report's structure and sane values; Dask's stop at a size it cannot
finish; the size parsing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import graph_scale  # noqa: E402


def section(doc: str, title: str) -> list[dict[str, str]]:
    """The rows of the first table under ``## title``, as dicts by column."""
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"## {title}"))
    lines = lines[start + 1 :]
    end = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    table = [line for line in lines[:end] if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        for row in table[2:]
    ]


def number(cell: str) -> float:
    return float(cell.replace(",", "").split()[0])


def test_sizes_parse_and_bad_sizes_are_named():
    assert graph_scale.parse_count("2000") == 2000
    assert graph_scale.parse_count("10k") == 10_000
    assert graph_scale.parse_count("1M") == 1_000_000
    assert graph_scale.parse_count("2.5k") == 2500
    assert graph_scale.size_label(3_000_000) == "3M"
    assert graph_scale.size_label(100_000) == "100k"
    with pytest.raises(ValueError, match="not a task count: 'lots'"):
        graph_scale.parse_count("lots")
    with pytest.raises(ValueError, match="at least 4"):
        graph_scale.parse_count("2")
    with pytest.raises(SystemExit):
        graph_scale.parse_args(["--modes", "zero,sideways"])


def test_graph_has_about_the_size_in_tasks():
    from benchmarks.workloads import dask_task_count

    collection, expected = graph_scale.make_graph(2000, 3)
    assert dask_task_count(collection) == 2003  # 1,500 chunks, a 4-way tree, finalize
    assert expected == 1500 * 4


@pytest.mark.parametrize("ndim, side", [(2, 39), (3, 11)])
def test_ndim_makes_the_same_chunks_over_several_axes(monkeypatch, ndim, side):
    import dask

    monkeypatch.setattr(graph_scale, "NDIM", ndim)
    collection, expected = graph_scale.make_graph(2000, 3)  # ~1,500 chunks
    assert expected == side**ndim * 4  # (ones + 3) summed over side**ndim chunks of 1
    assert dask.compute(collection, scheduler="sync")[0] == expected
    with pytest.raises(SystemExit):
        graph_scale.parse_args(["--ndim", "4"])


@pytest.mark.timeout(300)
def test_tiny_run_reports_both_systems_and_modes(tmp_path):
    out = tmp_path / "report.md"
    code = graph_scale.main(["--sizes", "2k", "--out", str(out), "--logdir", str(tmp_path)])
    assert code == 0
    doc = out.read_text()
    assert "- command: `python benchmarks/graph_scale.py --sizes 2k" in doc
    assert "load average (1/5/15 min)" in doc

    zero = {row["system"]: row for row in section(doc, "Zero workers (scheduler only)")}
    assert set(zero) == {"shoal", "dask"}
    for system, row in zero.items():
        assert row["size"] == "2k"
        assert row["tasks"] == "2,003", system  # exact count, as the scheduler holds it
        client, submit = number(row["client s"]), number(row["submit s"])
        assert 0 <= client <= submit < 60, (system, row)
        assert number(row["ingest tasks/s"]) > 100, (system, row)
        assert 0 < number(row["B/task"]) < 1e6, (system, row)
    assert 0 < number(zero["shoal"]["zero-work finish s"]) < 60
    assert zero["dask"]["zero-work finish s"] == "n/a"

    workers = {row["system"]: row for row in section(doc, "Two workers, one thread each")}
    assert set(workers) == {"shoal", "dask"}
    for system, row in workers.items():
        assert row["tasks"] == "2,003", system
        assert 0 <= number(row["client s"]) <= number(row["end-to-end s"]) < 120, (system, row)

    ratios = section(doc, "shoal against Dask (> 1: shoal better)")
    assert [row["size"] for row in ratios] == ["2k"]
    assert all(row[c].endswith("×") for row in ratios for c in row if c != "size")

    phases = {row["mode"]: row for row in section(doc, "Where shoal's client time goes")}
    assert set(phases) == {"zero", "workers"}
    for row in phases.values():
        assert number(row["materialise"]) > 0 and number(row["encode"]) > 0

    bars = {row["target"]: row for row in section(doc, "The bar (issue 16)")}
    assert bars["1M-task graph submitted (scheduler holds every task)"]["shoal"] == "not run"
    assert "Notes and failures" not in doc


@pytest.mark.timeout(120)
def test_dask_stops_at_a_size_past_its_limit(tmp_path):
    out = tmp_path / "report.md"
    argv = ["--sizes", "2k,3k", "--systems", "dask", "--modes", "zero", "--logdir", str(tmp_path)]
    code = graph_scale.main([*argv, "--dask-limit", "0.001", "--out", str(out)])
    assert code == 1  # a failed run
    doc = out.read_text()
    rows = {row["size"]: row for row in section(doc, "Zero workers (scheduler only)")}
    assert rows["2k"]["tasks"] == "FAILED"
    assert rows["3k"]["tasks"] == "skipped"
    assert (
        "- dask: failed or exceeded --dask-limit 0.001 s at 2k (zero); larger sizes skipped" in doc
    )
    assert f"(logs kept in {tmp_path}" in doc  # the failed run's logs, for a look
