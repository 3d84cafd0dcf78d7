"""dask.dataframe picks shoal's P2P shuffle while a shoal client is Dask's scheduler.

Dask chooses a shuffle method in ``dask.utils.get_default_shuffle_method`` (which says
"disk" unless a *distributed* client is the default) and lowers ``Shuffle`` to
``P2PShuffle``/``DiskShuffle``/... and a merge to ``HashJoinP2P`` (both of which need
the ``distributed`` package). :func:`install` wraps these few places; every wrapper
defers to Dask's own code unless a shoal client is the scheduler, so Dask's own
distributed Client in the same process works unchanged. Under shoal:

- the default method is "p2p" (with pyarrow installed, as Dask) and "p2p" means
  :class:`ShoalP2PShuffle`: transfer tasks, a barrier, unpack tasks (shoal/shuffle);
- a merge that Dask would do as ``HashJoinP2P`` is two P2P shuffles of the sides into
  the same number of partitions and a partition-wise merge (output partition ``i`` of
  both sides has the same owner: shoal/shuffle/_plan.py);
- "disk" is refused: its partd files live in each worker's own temporary directory,
  so on several hosts rows are lost without an error;
- "tasks" (argument or ``dataframe.shuffle.method``) works as in Dask.

It is installed when a shoal client becomes Dask's scheduler or computes a collection;
if dask.dataframe is not imported yet, right after it is.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from shoal.protocol import messages as m

SHOAL_P2P = "shoal-p2p"  # the method name Dask's own "p2p" checks do not recognise
DISK_REFUSED = (
    "shuffle method 'disk' is refused on a shoal cluster: it writes partd files to each "
    "worker's own temporary directory, so on workers that do not share one filesystem "
    "(several hosts) rows are lost without an error. Use 'p2p' (the default) or 'tasks'."
)

# True while a shoal client computes or submits collections (``Client.compute``, ...),
# also when it is not Dask's default scheduler.
_computing: contextvars.ContextVar[bool] = contextvars.ContextVar("shoal_computing", default=False)
_install_lock = threading.Lock()
_installed = False
_patched = False
# A shoal P2P graph was built in this process: look for shuffle tasks.
_built: dict[str, bool] = {"any": False}


class DiskShuffleRefused(ValueError):
    pass


@contextlib.contextmanager
def computing() -> Iterator[None]:
    token = _computing.set(True)
    try:
        yield
    finally:
        _computing.reset(token)


def shoal_is_scheduler() -> bool:
    """A shoal client is Dask's scheduler here (or is computing collections)."""
    if _computing.get():
        return True
    import dask

    from shoal.client.client import Client

    scheduler = dask.config.get("scheduler", None)
    return isinstance(getattr(scheduler, "__self__", None), Client)


def _shoal_default() -> str:
    import dask

    method = dask.config.get("dataframe.shuffle.method", None)
    if method == "disk":
        raise DiskShuffleRefused(DISK_REFUSED + " (from dask.config 'dataframe.shuffle.method')")
    if method:
        return method
    return "p2p" if importlib.util.find_spec("pyarrow") is not None else "tasks"


# ------------------------------------------------------------------------ installing


def install() -> None:
    """Wrap Dask's shuffle choices (idempotent); dask.dataframe's part now, or once it
    is imported."""
    global _installed
    with _install_lock:
        if _installed:
            return
        _installed = True
        import dask.utils

        original = dask.utils.get_default_shuffle_method
        dask.utils.get_default_shuffle_method = _wrap_default(original, "p2p")
        if "dask.dataframe" in sys.modules:
            _patch_dataframe(original)
        else:
            sys.meta_path.insert(
                0, _AfterImport("dask.dataframe", lambda: _patch_dataframe(original))
            )


class _AfterImport:
    """A meta path finder that runs ``then`` once module ``name`` has been executed."""

    def __init__(self, name: str, then: Any):
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        then = self.then

        def exec_then(module: Any) -> None:
            exec_module(module)
            then()

        spec.loader.exec_module = exec_then  # type: ignore[method-assign]
        return spec


def _wrap_default(original: Any, p2p_name: str) -> Any:
    @functools.wraps(original)
    def get_default_shuffle_method() -> str:
        if not shoal_is_scheduler():
            return original()
        method = _shoal_default()
        return p2p_name if method == "p2p" else method

    get_default_shuffle_method.__shoal__ = True  # type: ignore[attr-defined]
    return get_default_shuffle_method


def _patch_dataframe(original: Any) -> None:
    global _patched
    if _patched:
        return
    _patched = True
    from dask.dataframe.dask_expr import _collection, _merge, _shuffle, _util

    default = _wrap_default(original, "p2p")
    for module in (_shuffle, _merge, _util):
        module.get_default_shuffle_method = default  # type: ignore[attr-defined]
    # DataFrame.shuffle checks dtypes with distributed when the method is "p2p": it
    # sees shoal's name instead (shoal's P2P takes any dtype pickle takes).
    _collection.get_default_shuffle_method = _wrap_default(original, SHOAL_P2P)

    frame_shuffle = _collection.FrameBase.shuffle

    @functools.wraps(frame_shuffle)
    def shuffle(self: Any, *args: Any, **kwargs: Any) -> Any:
        if shoal_is_scheduler():
            method = kwargs.get("shuffle_method")
            if method == "disk":
                raise DiskShuffleRefused(DISK_REFUSED)
            if method == "p2p":
                kwargs["shuffle_method"] = SHOAL_P2P
        return frame_shuffle(self, *args, **kwargs)

    _collection.FrameBase.shuffle = shuffle  # type: ignore[method-assign]

    shuffle_lower = _shuffle.Shuffle._lower

    def lower_shuffle(self: Any) -> Any:
        method = self.method
        if method != SHOAL_P2P and not shoal_is_scheduler():
            return shuffle_lower(self)
        method = method or default()
        if method == "disk":
            raise DiskShuffleRefused(DISK_REFUSED)
        if method in ("p2p", SHOAL_P2P):
            return _shoal_p2p_class()(
                self.frame,
                self.partitioning_index,
                self.npartitions_out,
                self.ignore_index,
                self.options,
                self.original_partitioning_index,
            )
        return shuffle_lower(self)

    _shuffle.Shuffle._lower = lower_shuffle  # type: ignore[method-assign]

    merge_lower = _merge.Merge._lower

    def lower_merge(self: Any) -> Any:
        out = merge_lower(self)
        if not isinstance(out, _merge.HashJoinP2P) or not (
            self.shuffle_method == SHOAL_P2P or shoal_is_scheduler()
        ):
            return out
        n = out.operand("_npartitions")
        left, right = self.left, self.right
        left_on, right_on = out.operand("shuffle_left_on"), out.operand("shuffle_right_on")
        if left_on:
            left = _shuffle.RearrangeByColumn(
                left, left_on, npartitions_out=n, method=SHOAL_P2P, index_shuffle=self.left_index
            )
        if right_on:
            right = _shuffle.RearrangeByColumn(
                right,
                right_on,
                npartitions_out=n,
                method=SHOAL_P2P,
                index_shuffle=self.right_index,
            )
        return _merge.BlockwiseMerge(left, right, **self.kwargs)

    _merge.Merge._lower = lower_merge  # type: ignore[method-assign]


# ------------------------------------------------------------------------ the graph


def _shoal_p2p_class() -> type:
    from shoal.shuffle._expr import ShoalP2PShuffle  # imports dask.dataframe

    return ShoalP2PShuffle


def shuffle_marks(dsk: Mapping[Any, Any]) -> dict[Any, m.ShuffleMark]:
    """The shuffle tasks of a graph, marked for the scheduler (none unless a shoal P2P
    graph was built in this process: no cost for other graphs)."""
    if not _built["any"]:
        return {}
    from shoal.shuffle._tasks import shuffle_barrier, shuffle_transfer, shuffle_unpack

    marks = {}
    for key, node in dsk.items():
        func = getattr(node, "func", None)
        if func is shuffle_transfer:
            marks[key] = m.ShuffleMark(node.args[1], "transfer", node.args[2])
        elif func is shuffle_barrier:
            marks[key] = m.ShuffleMark(node.args[0], "barrier")
        elif func is shuffle_unpack:
            marks[key] = m.ShuffleMark(node.args[0], "unpack", node.args[1])
    return marks
