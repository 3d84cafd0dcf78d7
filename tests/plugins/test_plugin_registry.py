"""The plugin registry and the client's reading of replies, without a network: which
hooks are called, how failures are reported, what a reply becomes."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from shoal import NannyPlugin, PluginError, SchedulerPlugin, WorkerPlugin
from shoal.client.plugins import _checked
from shoal.plugins.base import plugin_kind, plugin_name
from shoal.plugins.preload import PreloadError, Preloads, import_preload
from shoal.plugins.registry import PluginRegistry, result_of
from shoal.protocol import messages as m


class Registry:
    """A registry whose failures and spawned coroutines are kept for the test."""

    def __init__(self) -> None:
        self.failures: list[dict[str, Any]] = []
        self.spawned: list[Coroutine[Any, Any, Any]] = []
        self.r = PluginRegistry("scheduler", self.failures.append, self.spawned.append)


class Transitions(SchedulerPlugin):
    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        self.seen.append((key, start, finish, kwargs))


class Raises(WorkerPlugin):
    def setup(self, worker: Any) -> None:
        raise KeyError("missing")

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        raise ZeroDivisionError(key)


class AsyncAdd(SchedulerPlugin):
    def __init__(self) -> None:
        self.added: list[str] = []

    async def add_worker(self, scheduler: Any, worker: str) -> None:
        self.added.append(worker)
        if worker == "bad":
            raise RuntimeError("async failure")


def test_only_overridden_hooks_are_indexed() -> None:
    reg = Registry()
    reg.r.add("t", Transitions())
    assert reg.r.hooked("transition")
    assert not reg.r.hooked("add_worker")  # SchedulerPlugin's own: never called
    assert not reg.r.hooked("start")
    reg.r.remove("t")
    assert not reg.r.hooked("transition")


def test_dispatch_calls_each_plugin_and_reports_failures_without_stopping() -> None:
    reg = Registry()
    first, last = Transitions(), Transitions()
    reg.r.add("first", first)
    reg.r.add("raises", Raises())
    reg.r.add("last", last)
    reg.r.dispatch("transition", "k", "processing", "memory", stimulus_id="s-1")
    expected = [("k", "processing", "memory", {"stimulus_id": "s-1"})]
    assert first.seen == expected and last.seen == expected  # the failure in between
    (failure,) = reg.failures
    assert failure["plugin"] == "raises" and failure["hook"] == "transition"
    assert failure["where"] == "scheduler"
    assert failure["error"] == "ZeroDivisionError: k"
    assert "raise ZeroDivisionError(key)" in failure["traceback"]


def test_coroutine_hooks_are_spawned_and_their_failures_reported() -> None:
    reg = Registry()
    plugin = AsyncAdd()
    reg.r.add("a", plugin)
    reg.r.dispatch("add_worker", None, "good")
    reg.r.dispatch("add_worker", None, "bad")
    assert len(reg.spawned) == 2 and plugin.added == []  # not run until awaited

    async def run_all() -> list[Any]:
        return [await coro for coro in reg.spawned]

    outcomes = asyncio.run(run_all())
    assert plugin.added == ["good", "bad"]
    assert outcomes[0] is None and isinstance(outcomes[1], RuntimeError)
    assert [f["error"] for f in reg.failures] == ["RuntimeError: async failure"]


def test_call_returns_what_the_hook_raised() -> None:
    reg = Registry()
    reg.r.add("x", Raises())
    exc = asyncio.run(reg.r.call("x", "setup", None))
    assert isinstance(exc, KeyError)
    assert asyncio.run(reg.r.call("x", "teardown", None)) is None  # not overridden
    result = result_of(exc)
    assert result.status == "error" and result.error == "KeyError: 'missing'"
    assert "raise KeyError" in result.traceback
    assert result_of(None) == m.PluginResult("OK")


def test_close_all_tears_down_newest_first_and_forgets() -> None:
    order: list[str] = []

    class Named(WorkerPlugin):
        def __init__(self, name: str):
            self.name = name

        def teardown(self, worker: Any) -> None:
            order.append(self.name)

    reg = Registry()
    for name in "abc":
        reg.r.add(name, Named(name))
    asyncio.run(reg.r.close_all("teardown", None))
    assert order == ["c", "b", "a"]
    assert len(reg.r) == 0


def test_a_plugin_that_always_fails_is_logged_a_bounded_number_of_times(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = Registry()
    reg.r.add("raises", Raises())
    with caplog.at_level("ERROR", logger="shoal.plugins"):
        for i in range(50):
            reg.r.dispatch("transition", i, "a", "b", stimulus_id="s")
    assert len(reg.failures) == 50  # every failure is an event
    assert len(caplog.records) == 10  # the log gets the first tracebacks only


def test_kind_and_name_as_dask() -> None:
    assert plugin_kind(SchedulerPlugin()) == "scheduler"
    assert plugin_kind(WorkerPlugin()) == "worker"
    assert plugin_kind(NannyPlugin()) == "nanny"
    with pytest.raises(TypeError, match="is not a plugin"):
        plugin_kind(object())

    class Named(WorkerPlugin):
        name = "mine"

    assert plugin_name(Named()) == "mine"
    assert plugin_name(Raises()).startswith("Raises-")
    assert plugin_name(Raises()) != plugin_name(Raises())
    Named.name = ""
    with pytest.raises(TypeError, match="non-empty str"):
        plugin_name(Named())


def test_replies_become_results_or_errors() -> None:
    ok = m.PluginReply(1, "worker", {"tcp://a:1": m.PluginResult("OK")})
    assert _checked(ok, "p", "setup") == {"tcp://a:1": {"status": "OK"}}
    refused = m.PluginReply(1, error="no plugin named 'p'", error_type="ValueError")
    with pytest.raises(ValueError, match="no plugin named 'p'"):
        _checked(refused, "p", "teardown")
    no_token = m.PluginReply(1, error="has none", error_type="PermissionError")
    with pytest.raises(PermissionError):
        _checked(no_token, "p", "setup")
    failed = m.PluginReply(
        1,
        "worker",
        {
            "tcp://a:1": m.PluginResult("OK"),
            "tcp://b:1": m.PluginResult("error", "KeyError: 'x'", "Traceback: here"),
            "tcp://c:1": m.PluginResult("error", "KeyError: 'x'"),
        },
    )
    with pytest.raises(PluginError, match=r"'p' failed in setup on tcp://b:1 \(and on 1 more\)"):
        _checked(failed, "p", "setup")
    try:
        _checked(failed, "p", "setup")
    except PluginError as e:
        assert "Traceback: here" in str(e)
        assert e.results["tcp://a:1"] == {"status": "OK"}
        assert e.results["tcp://b:1"] == {"status": "error", "error": "KeyError: 'x'"}


# ------------------------------------------------------------------------ preload


def test_preload_by_path_and_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    (tmp_path / "by_path.py").write_text(
        "def shoal_setup(server):\n    server.append('path-setup')\n"
        "def shoal_teardown(server):\n    server.append('path-teardown')\n"
    )
    (tmp_path / "dask_named.py").write_text(
        "async def dask_setup(server):\n    server.append('dask-setup')\n"
        "def dask_teardown(server):\n    raise RuntimeError('logged, not raised')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    preloads = Preloads([str(tmp_path / "by_path.py"), "dask_named"])
    asyncio.run(preloads.setup(calls))
    asyncio.run(preloads.teardown(calls))
    assert calls == ["path-setup", "dask-setup", "path-teardown"]


def test_preload_errors_name_the_module(tmp_path: Path) -> None:
    with pytest.raises(PreloadError, match="--preload 'nonexistent_module_xyz': cannot import"):
        import_preload("nonexistent_module_xyz")
    with pytest.raises(PreloadError, match="cannot import it: FileNotFoundError"):
        import_preload(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("1 / 0\n")
    with pytest.raises(PreloadError, match="cannot import it: ZeroDivisionError"):
        import_preload(str(broken))
    raising = tmp_path / "raising.py"
    raising.write_text("def shoal_setup(server):\n    raise OSError('disk full')\n")
    with pytest.raises(PreloadError, match="its setup raised OSError: disk full"):
        asyncio.run(Preloads([str(raising)]).setup(None))
