"""Tasks that fail, are retried, or are cancelled, on a process cluster."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tasks import wait_for_file

import shoal
from shoal import Client, LocalCluster

pytestmark = pytest.mark.timeout(60)


class CustomError(Exception):
    """Defined in the test module: the workers import it by name."""

    def __init__(self, message, code):
        super().__init__(message, code)
        self.code = code


def inc(x):
    return x + 1


def explode_with_boom(x):
    raise ValueError("boom")


def raise_custom(x):
    raise CustomError(f"custom failure {x}", code=x)


def flaky(counter, failures):
    """Fail the first ``failures`` calls; the count lives in a file because every
    attempt may run in a different worker process."""
    path = Path(counter)
    n = int(path.read_text()) if path.exists() else 0
    path.write_text(str(n + 1))
    if n < failures:
        raise RuntimeError(f"flaky attempt {n + 1}")
    return f"ok after {n + 1} attempts"


def unpicklable_result(x):
    import threading

    return [threading.Lock()]


def _notes(exc: BaseException) -> str:
    return "\n".join(getattr(exc, "__notes__", []))


def test_exception_reraised_with_remote_traceback(client: Client) -> None:
    f = client.submit(explode_with_boom, 1)
    with pytest.raises(ValueError, match="boom") as info:
        f.result(timeout=30)
    assert type(info.value) is ValueError
    notes = _notes(info.value)
    assert "Traceback" in notes or "traceback" in notes
    assert "explode_with_boom" in notes
    assert 'raise ValueError("boom")' in notes
    assert f.status == "error"
    assert f.done()


def test_exception_and_traceback_methods(client: Client) -> None:
    f = client.submit(explode_with_boom, 2)
    exc = f.exception(timeout=30)
    assert isinstance(exc, ValueError)
    assert exc.args == ("boom",)
    tb = f.traceback(timeout=30)
    assert isinstance(tb, str)
    assert "explode_with_boom" in tb
    assert "ValueError: boom" in tb
    # a future that succeeded has no exception
    g = client.submit(inc, 1)
    assert g.exception(timeout=30) is None
    assert g.result(timeout=30) == 2


def test_dependent_of_failed_task_raises_same_error(client: Client) -> None:
    f = client.submit(explode_with_boom, 3)
    g = client.submit(inc, f)
    h = client.submit(inc, g)
    for fut in (g, h):
        with pytest.raises(ValueError, match="boom") as info:
            fut.result(timeout=30)
        assert "explode_with_boom" in _notes(info.value)
        assert fut.status == "error"
    with pytest.raises(ValueError, match="boom"):
        client.gather([client.submit(inc, 10), g])


def test_custom_exception_class(client: Client) -> None:
    f = client.submit(raise_custom, 7)
    with pytest.raises(CustomError) as info:
        f.result(timeout=30)
    assert type(info.value) is CustomError
    assert info.value.code == 7
    assert info.value.args == ("custom failure 7", 7)
    assert "raise_custom" in _notes(info.value)
    assert isinstance(f.exception(timeout=10), CustomError)


def test_cluster_still_works_after_failures(client: Client) -> None:
    bad = client.map(explode_with_boom, range(20))
    good = client.map(inc, range(20))
    assert client.gather(good) == list(range(1, 21))
    assert all(isinstance(b.exception(timeout=30), ValueError) for b in bad)


def test_gather_errors_skip(client: Client) -> None:
    bad = client.submit(explode_with_boom, 100)
    good = client.map(inc, range(3))
    bad.exception(timeout=30)
    # errors="skip" leaves the failed futures out, and keeps each value with its future
    assert client.gather([good[0], bad, good[1], good[2]], errors="skip") == [1, 2, 3]
    assert client.gather([bad], errors="skip") == []


def test_unpicklable_argument_fails_at_submit(client: Client) -> None:
    import threading

    with pytest.raises(shoal.SerializationError, match="lock"):
        client.submit(inc, threading.Lock())
    assert client.submit(inc, 1).result(timeout=30) == 2


def test_unpicklable_result_raises_instead_of_hanging(client: Client) -> None:
    # The task succeeds on the worker, but its result cannot be sent: asking for it
    # must fail with an error that says so, not wait forever.
    f = client.submit(unpicklable_result, 1)
    with pytest.raises(Exception) as info:
        f.result(timeout=10)
    assert not isinstance(info.value, TimeoutError), "result() hung on an unsendable value"
    assert "lock" in str(info.value)
    assert client.submit(inc, 2).result(timeout=30) == 3


def test_retries_succeed(client: Client, tmp_path: Path) -> None:
    counter = tmp_path / "count-ok"
    f = client.submit(flaky, str(counter), 2, retries=2)
    assert f.result(timeout=30) == "ok after 3 attempts"
    assert counter.read_text() == "3"


def test_retries_exhausted(client: Client, tmp_path: Path) -> None:
    counter = tmp_path / "count-fail"
    f = client.submit(flaky, str(counter), 2, retries=1)
    with pytest.raises(RuntimeError, match="flaky attempt 2"):
        f.result(timeout=30)
    assert counter.read_text() == "2"


def test_no_retries_by_default(client: Client, tmp_path: Path) -> None:
    counter = tmp_path / "count-none"
    f = client.submit(flaky, str(counter), 1)
    with pytest.raises(RuntimeError, match="flaky attempt 1"):
        f.result(timeout=30)
    assert counter.read_text() == "1"


def test_cancel_running_future_and_dependents(client: Client, stop_file: Path) -> None:
    f = client.submit(wait_for_file, str(stop_file), pure=False)
    g = client.submit(inc, f)
    h = client.submit(inc, g)
    time.sleep(0.3)  # let it start running on a worker
    assert f.status == "pending"
    f.cancel()
    with pytest.raises(shoal.CancelledError):
        f.result(timeout=10)
    assert f.status == "cancelled"
    assert f.cancelled()
    for dep in (g, h):
        with pytest.raises(shoal.CancelledError):
            dep.result(timeout=10)
        assert dep.status == "cancelled"
    # the cluster is still usable (the cancelled task's thread is let go)
    stop_file.touch()
    assert client.submit(inc, 41).result(timeout=30) == 42


def test_cancel_marks_futures_cancelled_on_return(client: Client, stop_file: Path) -> None:
    # The synchronous cancel() is done when it returns: the future says "cancelled"
    # at once (checked a few times over, as a race would only show sometimes).
    statuses = []
    for _ in range(10):
        f = client.submit(wait_for_file, str(stop_file), pure=False)
        f.cancel()
        statuses.append(f.status)
        blocked = [client.submit(wait_for_file, str(stop_file), pure=False) for _ in range(3)]
        client.cancel(blocked)
        statuses.extend(b.status for b in blocked)
    assert statuses == ["cancelled"] * 40
    assert f.cancelled()
    for b in [f, *blocked]:
        with pytest.raises(shoal.CancelledError):
            b.result(timeout=10)
    stop_file.touch()
    assert client.submit(inc, 1).result(timeout=30) == 2


def make_lock_or_array(kind: str) -> object:
    import threading

    import numpy as np

    return [threading.Lock()] if kind == "lock" else np.ones(200_000)


def combine(a: object, b: object) -> int:
    return 1


@pytest.mark.timeout(60)
def test_unsendable_dependency_errs_its_dependent(inproc_cluster: LocalCluster) -> None:
    # The dependent runs where the big array is, so the unpicklable value must travel
    # between workers. It cannot: the dependent errs, naming the reason (the key is
    # not recomputed over and over as if its data had been lost).
    with Client(inproc_cluster) as client:
        lock, array = client.map(make_lock_or_array, ["lock", "array"], pure=False)
        shoal.wait([lock, array], timeout=30)
        holders = {
            key: [w.address for w in inproc_cluster._workers if key in w.state.data]
            for key in (lock.key, array.key)
        }
        assert holders[lock.key] != holders[array.key], holders  # the precondition
        out = client.submit(combine, lock, array)
        with pytest.raises(shoal.SerializationError) as info:
            out.result(timeout=30)
        # Either the receiving worker erred the dependent ("cannot be sent from ... to"),
        # or the key erred first (its holder reports it cannot be pickled) and the
        # dependent with it.
        assert "cannot be sent" in str(info.value) or "cannot be pickled" in str(info.value)
        assert "lock" in str(info.value)
        # the key itself errs: its value cannot leave the worker
        with pytest.raises(shoal.SerializationError, match="cannot be pickled"):
            lock.result(timeout=30)
        assert client.submit(inc, 2).result(timeout=30) == 3
