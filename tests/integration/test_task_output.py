"""Task output reaches the client, on real worker processes: prints (stdout, stderr)
and log records at once, naming the worker; warnings raised again with their category
when the result is gathered (also those of a dask graph's intermediate tasks); bounded
when a task prints in a loop; attributed to the right task when tasks on two threads of
one worker warn at once; and none of it with ``Client(forward_output=False)``."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator

import pytest
from output_tasks import TaskWarning, flood, log_it, say, warn, warn_runtime, warn_together

from shoal import Client, LocalCluster
from shoal.server.output import OUTPUT_BYTES_PER_INTERVAL

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One worker process with two threads."""
    with LocalCluster(n_workers=1, threads_per_worker=2, timeout=60, validate=True) as c:
        yield c


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster, timeout=30) as c:
        yield c


def worker_address(client: Client) -> str:
    (address,) = client.scheduler_info()["workers"]
    return address


def test_prints_reach_the_client_naming_the_worker(client, capsys):
    assert client.submit(say, "hello from a task").result() == "hello from a task"
    out, err = capsys.readouterr()
    address = worker_address(client)
    assert f"[{address}] hello from a task\n" in out
    assert f"[{address}] hello from a task (to stderr)\n" in err
    assert "to stderr" not in out


def test_log_records_reach_the_logger_of_the_same_name(client, caplog):
    with caplog.at_level(logging.DEBUG, logger="shoal-test-task"):
        client.submit(log_it, "abc").result()
    records = [r for r in caplog.records if r.name == "shoal-test-task"]
    assert [r.levelno for r in records] == [logging.WARNING]  # the worker's level held
    assert records[0].getMessage().endswith("logged: abc")
    assert records[0].worker == worker_address(client)  # type: ignore[attr-defined]


def test_warnings_are_raised_again_with_their_category_when_gathered(client):
    future = client.submit(warn, "mind the gap")
    with pytest.warns(TaskWarning, match="mind the gap"):
        future.result()
    with pytest.warns(RuntimeWarning, match="runtime trouble"):
        client.gather([client.submit(warn_runtime, "runtime trouble")])


def test_a_warning_repeated_in_a_task_comes_once_per_task_and_in_every_task(client):
    futures = [client.submit(warn, "again and again", 50, pure=False) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        client.gather(futures)
    assert [str(w.message) for w in caught] == ["again and again"] * 3


def test_a_dask_graphs_intermediate_warnings_come_with_its_result(client):
    """As dask's own array tests expect (``RuntimeWarning`` from ``nanquantile``)."""
    da = pytest.importorskip("dask.array")
    np = pytest.importorskip("numpy")
    x = da.from_array(np.full((4, 4), np.nan), chunks=2)
    with pytest.warns(RuntimeWarning, match="All-NaN slice"):
        result = client.compute(da.nanquantile(x, 0.5, axis=0), sync=True)
    assert np.isnan(result).all()


def test_warnings_of_tasks_on_two_threads_stay_with_their_task(client):
    a = client.submit(warn_together, "from a")
    b = client.submit(warn_together, "from b")
    a_result = a.result  # gathered later: its warnings wait for it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b.result()
    assert [str(w.message) for w in caught] == ["from b"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a_result()
    assert [str(w.message) for w in caught] == ["from a"]


def test_a_task_printing_in_a_loop_is_bounded_and_says_what_was_dropped(client, capsys):
    nbytes = 20 * OUTPUT_BYTES_PER_INTERVAL
    assert client.submit(flood, nbytes).result() == nbytes
    out, err = capsys.readouterr()
    assert len(out) < nbytes / 4  # most of it never left the worker
    assert "characters of this task's output dropped" in err
    assert client.submit(say, "still here", pure=False).result() == "still here"


def test_no_output_with_forward_output_off(cluster, capsys):
    with Client(cluster, timeout=30, forward_output=False) as quiet:
        assert quiet.submit(say, "unheard").result() == "unheard"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet.submit(warn, "unseen").result()
    assert caught == []
    out, err = capsys.readouterr()
    assert "unheard" not in out and "unheard" not in err
