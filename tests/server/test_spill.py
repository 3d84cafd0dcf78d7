"""SpillBuffer: least recently used values to disk past the target, back on reading."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from shoal.server.spill import SpillBuffer

pytestmark = pytest.mark.timeout(30)

MB = 1_000_000


def array(i: int, mb: int = 1) -> np.ndarray:
    return np.full(mb * MB // 8, i, dtype=np.float64)


def files(path: Path) -> list[str]:
    return sorted(os.listdir(path)) if path.exists() else []


def test_least_recently_used_values_go_to_disk_and_come_back(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path / "spill"), target=int(2.5 * MB))
    for i in range(4):
        buf[f"x{i}"] = array(i)
    assert buf.spilled_keys == {"x0", "x1"}
    assert len(files(tmp_path / "spill")) == 2
    assert buf.memory_bytes == 2 * MB and buf.spilled_bytes > 2 * MB
    assert len(buf) == 4 and set(buf) == {"x0", "x1", "x2", "x3"} and "x0" in buf
    buf["x2"]  # now x3 is the least recently used
    back = buf["x0"]
    np.testing.assert_array_equal(back, array(0))
    back[0] = 7.0  # read back into writable memory
    assert buf.spilled_keys == {"x1", "x3"}
    assert buf.spill_count == 3 and buf.unspill_count == 1
    del buf["x1"]  # a spilled key: its file goes
    del buf["x0"]  # one in memory
    assert set(buf) == {"x2", "x3"} and len(files(tmp_path / "spill")) == 1
    buf.close()
    assert not (tmp_path / "spill").exists()


def test_plain_values_spill_too(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path), target=None)
    buf["a"] = {"k": [1, 2, "three"]}
    buf[("t", 1)] = b"x" * 1000
    assert buf.evict() > 0 and buf.evict() > 0 and buf.evict() == 0
    assert buf.spilled_keys == {"a", ("t", 1)} and buf.memory_bytes == 0
    assert buf["a"] == {"k": [1, 2, "three"]} and buf[("t", 1)] == b"x" * 1000


def test_overwriting_a_spilled_key_removes_its_file(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path), target=None)
    buf["a"] = array(1)
    buf.evict()
    assert len(files(tmp_path)) == 1
    buf["a"] = 5
    assert files(tmp_path) == [] and buf["a"] == 5 and buf.spilled_bytes == 0


def test_unpicklable_value_stays_in_memory_and_is_reported_once(tmp_path: Path) -> None:
    reports: list[tuple[object, str]] = []
    buf = SpillBuffer(
        str(tmp_path), target=MB, on_unserializable=lambda k, r: reports.append((k, r))
    )
    lock = threading.Lock()
    buf["lock"] = lock
    buf["big"] = array(1, 2)  # over the target: the lock is older, but cannot go
    assert buf.spilled_keys == {"big"}
    assert [k for k, _ in reports] == ["lock"] and "lock" in reports[0][1]
    assert buf["lock"] is lock
    buf["other"] = array(2, 2)
    assert len(reports) == 1  # the lock is not tried again
    del buf["lock"]
    assert buf.spilled_keys == {"big", "other"}


def test_a_missing_key_raises_key_error(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path))
    with pytest.raises(KeyError):
        buf["nope"]
    with pytest.raises(KeyError):
        del buf["nope"]


def test_threads_read_while_another_writes(tmp_path: Path) -> None:
    buf = SpillBuffer(str(tmp_path), target=3 * 100_000)
    n = 40
    errors: list[BaseException] = []

    def value(i: int) -> np.ndarray:
        return np.full(100_000 // 8, i, dtype=np.float64)

    for i in range(n):
        buf[i] = value(i)

    def reader(seed: int) -> None:
        try:
            for j in range(300):
                i = (seed * 7 + j * 13) % n
                assert buf[i][0] == i
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for j in range(300):  # the writer: overwrite values while the readers run
        buf[j % n] = value(j % n)
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert len(buf) == n and buf.memory_bytes <= 3 * 100_000
    assert len(files(tmp_path)) == len(buf.spilled_keys) == n - 3


def test_many_unpicklable_values_do_not_exhaust_the_stack(tmp_path: Path) -> None:
    reports: list[object] = []
    buf = SpillBuffer(str(tmp_path), target=None, on_unserializable=lambda k, r: reports.append(k))
    for i in range(3000):
        buf[i] = threading.Lock()
    buf["array"] = array(1)
    assert buf.evict() > 0
    assert buf.spilled_keys == {"array"} and len(reports) == 3000
    assert buf.evict() == 0


def test_a_failed_write_keeps_the_value_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    buf = SpillBuffer(str(blocker / "spill"), target=None)
    buf["a"] = array(1)
    assert buf.evict() == 0
    assert buf.spilled_keys == set() and buf["a"][0] == 1.0


def test_a_result_stored_with_its_measured_size_is_not_measured_again(tmp_path: Path) -> None:
    """The worker's state machine stores a task's result with the size its thread
    measured (ExecuteSuccess.nbytes): that size is what counts against the target,
    overwriting works as with ``buf[key] = value``, and spilling follows."""
    from shoal.core.worker.state import Execute, ExecuteSuccess, WorkerState
    from shoal.protocol.messages import ComputeTask, Payload

    buf = SpillBuffer(str(tmp_path / "spill"), target=int(2.5 * MB))
    ws = WorkerState(1, "tcp://me:1", validate=True, data=buf)
    for i in range(3):
        key = f"x{i}"
        compute = ComputeTask(key, "f", Payload(0, b"\x92\x90\x80"), (i,), [], f"c{i}")
        assert ws.handle(compute) == [Execute(key, f"c{i}")]
        ws.handle(ExecuteSuccess(key, array(i), MB + i, None, "ndarray", 1.0, 2.0, f"d{i}"))
    assert buf.spilled_keys == {"x0"}  # 3 MB + 3 bytes over a 2.5 MB target
    assert buf.memory_bytes == (MB + 1) + (MB + 2)  # the sizes given, not measured again
    buf.store("x1", array(9), 5)  # overwritten in memory
    assert buf.memory_bytes == 5 + (MB + 2) and buf.spilled_keys == {"x0"}
    buf.store("x0", array(8), 7)  # overwriting a spilled key removes its file
    assert buf.spilled_count == 0 and files(tmp_path / "spill") == []
    np.testing.assert_array_equal(buf["x0"], array(8))
