"""Calls nested inside one task's arguments, evaluated on the worker before the task runs.

Dask lets a task's argument be another, inline task (``Task(k, f, Task(None, g, x))``):
``g(x)`` is computed in place, inside the same task. Such arguments travel as
:class:`Call` and :class:`Build` objects in the payload; the worker's function is
:func:`run_nested`, which evaluates them depth first. Containers the user passed as
plain values are never walked: only ``Call`` arguments and ``Build`` items are.
"""

from __future__ import annotations

from typing import Any


class Call:
    """``func(*args, **kwargs)``, with nested calls among the arguments evaluated first."""

    __slots__ = ("func", "args", "kwargs")

    def __init__(self, func: Any, args: tuple, kwargs: dict):
        self.func = func
        self.args = args
        self.kwargs = kwargs

    def __reduce__(self) -> Any:
        return (Call, (self.func, self.args, self.kwargs))

    def __repr__(self) -> str:
        return (
            f"Call({getattr(self.func, '__name__', self.func)!r}, {self.args!r}, {self.kwargs!r})"
        )


class Build:
    """A list, tuple, set or dict (items flat: key, value, ...) with nested calls inside."""

    __slots__ = ("kind", "items")

    def __init__(self, kind: str, items: list):
        self.kind = kind
        self.items = items

    def __reduce__(self) -> Any:
        return (Build, (self.kind, self.items))

    def __repr__(self) -> str:
        return f"Build({self.kind!r}, {self.items!r})"


def evaluate(obj: Any) -> Any:
    t = type(obj)
    if t is Call:
        args = [evaluate(a) for a in obj.args]
        kwargs = {k: evaluate(v) for k, v in obj.kwargs.items()}
        return obj.func(*args, **kwargs)
    if t is Build:
        items = [evaluate(x) for x in obj.items]
        kind = obj.kind
        if kind == "dict":
            return dict(zip(items[::2], items[1::2]))
        if kind == "tuple":
            return tuple(items)
        if kind == "set":
            return set(items)
        return items
    return obj


def run_nested(call: Call) -> Any:
    """The function of a task whose arguments hold nested calls."""
    return evaluate(call)


_dask_task: Any = None  # dask's Task class, once a fused subgraph has needed it


def rebuild_task(key: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """A Dask ``Task`` inside a fused subgraph, sent without its cached token and repr."""
    global _dask_task
    task = _dask_task
    if task is None:  # (imported once: an import statement per task costs microseconds)
        from dask._task_spec import Task

        task = _dask_task = Task
    return task(key, func, *args, **kwargs)


def identity(value: Any) -> Any:
    """The function of an alias (its one dependency's value) and of a data node."""
    return value
