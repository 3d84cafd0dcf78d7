"""Releases from the caller's thread right after results arrive are sent by a flush the
client's loop armed on those results (``RELEASE_FLUSH_DELAY`` later), not by waking the
loop at once; any other message still wakes it, and goes out behind those releases."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import dask
import pytest
from recording_scheduler import wait_for
from test_inline_results import CountingScheduler, counting_scheduler

from shoal import Client
from shoal.client import client as client_module

pytestmark = pytest.mark.timeout(90)
DELAY = 1.0  # long enough to tell "at once" from "by the armed flush" on a busy machine


@pytest.fixture
def one_worker(spawn: Callable[..., Any]) -> Iterator[CountingScheduler]:
    with counting_scheduler() as s:
        spawn("worker", s.address, "--name", "wa")
        yield s


@pytest.fixture
def slow_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "RELEASE_FLUSH_DELAY", DELAY)


def test_a_computes_release_waits_for_the_armed_flush(one_worker: Any, slow_flush: None) -> None:
    s = one_worker
    with Client(s.address, timeout=30) as client:
        client.wait_for_workers(1, timeout=20)
        before = s.count("ReleaseKeys")
        assert dask.delayed(sum)([1, 2, 3]).compute(scheduler=client.get) == 6
        # get's futures are gone: their release is queued, not sent at once ...
        time.sleep(DELAY / 4)
        assert s.count("ReleaseKeys") == before
        assert not client._states
        # ... and the armed flush sends it.
        wait_for(lambda: s.count("ReleaseKeys") == before + 1, 20, "the release")
        wait_for(lambda: not s.state.tasks, 20, "the key forgotten")


def test_a_submission_behind_a_waiting_release_goes_at_once(
    one_worker: Any, slow_flush: None
) -> None:
    s = one_worker
    with Client(s.address, timeout=30) as client:
        client.wait_for_workers(1, timeout=20)
        before = s.count("ReleaseKeys")
        same_key = dask.delayed(sum)([1, 2, 3], dask_key_name="same-key")
        assert same_key.compute(scheduler=client.get) == 6
        start = time.monotonic()
        # The same key again: the waiting release must reach the scheduler before this
        # submission, or it would release the key it is asked for (and this would hang).
        assert same_key.compute(scheduler=client.get) == 6
        future = client.submit(sum, [4, 5])
        assert future.result(timeout=20) == 9
        assert time.monotonic() - start < DELAY / 2  # woken by the submissions, not later
        assert s.count("ReleaseKeys") >= before + 1
        assert s.state.tasks.keys() == {future.key}


def test_a_release_with_no_results_arriving_goes_at_once(one_worker: Any, slow_flush: None) -> None:
    s = one_worker
    with Client(s.address, timeout=30) as client:
        client.wait_for_workers(1, timeout=20)
        future = client.submit(sum, [1, 2])
        assert future.result(timeout=20) == 3
        time.sleep(DELAY * 1.5)  # the flush armed by its result has passed
        before = s.count("ReleaseKeys")
        del future
        wait_for(lambda: s.count("ReleaseKeys") == before + 1, DELAY / 2, "the release")
