"""The worker's task-output collector and stream proxy, without installing them in
this process: a task thread's writes are captured per key, other threads' pass
through; text is bounded per interval with a note of what was dropped; a warning
repeated in a task is kept once; the client side reads it back."""

from __future__ import annotations

import io
import logging
import threading
import warnings

import msgspec
import pytest

from shoal.client.output import OutputReceiver, _category
from shoal.protocol import messages as m
from shoal.server.output import (
    OUTPUT_BYTES_PER_INTERVAL,
    OutputCollector,
    _TaskLogHandler,
    _ThreadStream,
)


def entries(msgs: list[m.TaskOutput]) -> dict[object, list[list[object]]]:
    return {msg.key: msgspec.msgpack.decode(msg.data) for msg in msgs}


def test_a_task_threads_writes_are_captured_and_others_pass_through():
    collector = OutputCollector()
    original = io.StringIO()
    stream = _ThreadStream(original, "stdout", collector)
    stream.write("not a task\n")

    def task() -> None:
        collector.begin("k")
        try:
            stream.write("one ")
            stream.write("line\n")
        finally:
            collector.end("k")

    t = threading.Thread(target=task)
    t.start()
    t.join()
    stream.write("after\n")
    assert original.getvalue() == "not a task\nafter\n"
    assert entries(collector.take()) == {"k": [["stdout", "one line\n"]]}  # one entry
    assert collector.take() == []


def test_text_beyond_the_budget_is_dropped_with_a_note():
    collector = OutputCollector()
    collector.add_text("k", "stdout", "x" * (OUTPUT_BYTES_PER_INTERVAL + 500))
    collector.add_text("k", "stdout", "y" * 10)
    (got,) = entries(collector.take(refill=True)).values()
    assert got[0] == ["stdout", "x" * OUTPUT_BYTES_PER_INTERVAL]
    assert got[1][0] == "stderr" and "510 characters" in got[1][1]
    collector.add_text("k", "stdout", "fresh")  # a new interval, a new budget
    assert entries(collector.take()) == {"k": [["stdout", "fresh"]]}


def test_a_warning_repeated_in_one_task_is_kept_once_and_again_in_the_next():
    collector = OutputCollector()
    for _ in range(5):
        collector.add_warning("a", RuntimeWarning, "w", "f.py", 3)
    collector.end("a")
    collector.add_warning("a", RuntimeWarning, "w", "f.py", 3)  # a later run of it
    got = entries(collector.take())["a"]
    assert got == [["warning", "w", "builtins:RuntimeWarning", "f.py", 3]] * 2


def test_log_records_of_a_task_thread_are_captured():
    collector = OutputCollector()
    handler = _TaskLogHandler(collector)
    record = logging.makeLogRecord({"name": "x", "levelno": 30, "msg": "hi %s", "args": (1,)})
    handler.emit(record)  # not a task thread: nothing
    collector.begin("k")
    handler.emit(record)
    collector.end("k")
    ((kind, text, name, level, _),) = entries(collector.take())["k"]
    assert (kind, text, name, level) == ("log", "hi 1", "x", 30)


def test_the_client_raises_warnings_of_gathered_and_intermediate_keys_only():
    receiver = OutputReceiver()
    data = msgspec.msgpack.encode([["warning", "careful", "builtins:RuntimeWarning", "f.py", 1]])
    for key in ("gathered", "held-elsewhere", "intermediate"):
        receiver.received(m.TaskOutput(key, "tcp://w:1", data))
    held = {"gathered": object(), "held-elsewhere": object()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        receiver.reraise(["gathered"], held)
    assert [w.category for w in caught] == [RuntimeWarning, RuntimeWarning]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        receiver.reraise(["held-elsewhere"], held)
    assert len(caught) == 1


@pytest.mark.parametrize(
    "name, expected",
    [
        ("builtins:RuntimeWarning", RuntimeWarning),
        ("warnings:WarningMessage", UserWarning),  # not a Warning subclass
        ("no.such.module:Foo", UserWarning),
    ],
)
def test_warning_categories_are_looked_up_by_name(name, expected):
    assert _category(name) is expected
