"""Published datasets and fire_and_forget on real processes: the scheduler keeps the
keys alive with no client holding them."""

from __future__ import annotations

import gc
import time
from pathlib import Path

import dask.array as da
import numpy as np
import pytest

from shoal import Client, LocalCluster, fire_and_forget


def test_a_dataset_outlives_its_publisher(cluster: LocalCluster) -> None:
    with Client(cluster, timeout=30) as publisher:
        futures = publisher.map(lambda x: x * 10, range(4), pure=False)
        keys = [f.key for f in futures]
        publisher.publish_dataset(tens=futures)
        publisher.publish_dataset({"a": futures[0]}, name="dict")
        assert publisher.list_datasets() == ["dict", "tens"]
        with pytest.raises(ValueError, match="already exists"):
            publisher.publish_dataset(tens=[])
    with Client(cluster, timeout=30) as reader:
        got = reader.get_dataset("tens")
        assert [f.key for f in got] == keys
        assert reader.gather(got) == [0, 10, 20, 30]
        assert reader.gather(reader.get_dataset("dict")) == {"a": 0}
        reader.unpublish_dataset("tens")
        reader.unpublish_dataset("dict")
        assert reader.list_datasets() == []
        assert reader.get_dataset("tens", default=None) is None
        with pytest.raises(KeyError, match="no dataset 'tens'"):
            reader.get_dataset("tens")
        with pytest.raises(KeyError):
            reader.unpublish_dataset("tens")
        assert reader.gather(got) == [0, 10, 20, 30]  # still held: this client has them
        del got
        gc.collect()
        deadline = time.monotonic() + 10
        while any(reader.who_has().get(k) for k in keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        held = reader.who_has()  # every key on the cluster, as Dask's
        assert not any(held.get(k) for k in keys), "released once nobody holds them"


def test_a_persisted_dask_collection_as_a_dataset(cluster: LocalCluster) -> None:
    x = np.arange(100).reshape(10, 10)
    with Client(cluster, timeout=30) as publisher:
        arr = publisher.persist(da.from_array(x, chunks=5) + 1)
        publisher.publish_dataset(arr, name="array", override=True)
    with Client(cluster, timeout=30) as reader:
        got = reader.get_dataset("array")
        assert np.array_equal(got.sum(axis=0).compute(), (x + 1).sum(axis=0))
        reader.unpublish_dataset("array")


def write_file(_: object, path: str, value: str) -> str:
    Path(path).write_text(value)
    return value


def submit_chain(c: Client, target: Path) -> object:
    """A task that can only start after a 1 s task: released before then, it never runs."""
    first = c.submit(time.sleep, 1.0, pure=False)
    return c.submit(write_file, first, str(target), "done", pure=False)


def test_fire_and_forget_runs_after_the_client_left(cluster: LocalCluster, tmp_path: Path) -> None:
    target = tmp_path / "fired.txt"
    with Client(cluster, timeout=30) as c:
        f = submit_chain(c, target)
        fire_and_forget(f)
        key = f.key  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert target.read_text() == "done"
    with Client(cluster, timeout=30) as c:  # and is let go once done
        deadline = time.monotonic() + 10
        while str(key) in c.run_on_scheduler(_task_keys):
            if time.monotonic() > deadline:
                raise AssertionError(f"{key} still held after it finished")
            time.sleep(0.05)


def test_without_fire_and_forget_the_chain_is_dropped(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    target = tmp_path / "dropped.txt"
    with Client(cluster, timeout=30) as c:
        submit_chain(c, target)
    time.sleep(2.5)
    assert not target.exists()


def _task_keys(dask_scheduler: object) -> list[str]:
    return [str(k) for k in dask_scheduler.state.tasks]  # type: ignore[attr-defined]
