"""Periodic loops of an idle worker sleep longer, and work wakes them at once."""

from __future__ import annotations

import asyncio

from shoal.server.idle import Activity


def test_an_idle_sleep_ends_when_work_starts():
    async def main() -> bool:
        activity = Activity(lambda: False, idle_interval=3600)
        sleeper = asyncio.ensure_future(activity.sleep(0.1))
        await asyncio.sleep(0)  # it waits
        assert not sleeper.done()
        activity.started()
        await asyncio.wait_for(sleeper, 10)  # not an hour
        return True

    assert asyncio.run(main())


def test_two_idle_loops_are_both_woken():
    async def main() -> None:
        activity = Activity(lambda: False, idle_interval=3600)
        sleepers = [asyncio.ensure_future(activity.sleep(0.1)) for _ in range(2)]
        await asyncio.sleep(0)
        activity.started()
        await asyncio.wait_for(asyncio.gather(*sleepers), 10)

    asyncio.run(main())


def test_a_busy_worker_sleeps_the_short_interval_work_or_not():
    async def main() -> None:
        activity = Activity(lambda: True, idle_interval=3600)
        await asyncio.wait_for(activity.sleep(0.01), 10)  # no started() needed

    asyncio.run(main())
