"""``--preload MODULE_OR_PATH.py`` for ``shoal scheduler`` and ``shoal worker``: import
the module (a dotted name on the path, or a ``.py`` file), then call its
``shoal_setup(server)`` once the server runs and ``shoal_teardown(server)`` once it has
closed, if it has them. Dask's ``dask_setup`` / ``dask_teardown`` are accepted too
(also as click commands, called with their defaults), so Dask preload scripts work.

A preload that cannot be imported, or whose setup raises, stops the process at
startup with a message naming the module (the CLI exits non-zero)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from shoal.plugins.registry import describe

logger = logging.getLogger("shoal.preload")

SETUP_NAMES = ("shoal_setup", "dask_setup")
TEARDOWN_NAMES = ("shoal_teardown", "dask_teardown")


class PreloadError(Exception):
    """A preload module could not be imported, or its setup raised."""


def import_preload(spec: str) -> ModuleType:
    """The module ``spec`` names: a path ending in ``.py``, or a dotted module name."""
    try:
        if spec.endswith(".py"):
            path = os.path.abspath(spec)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no file {path}")
            name = "shoal_preload_" + os.path.basename(path)[:-3].replace("-", "_")
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:  # pragma: no cover
                raise ImportError(f"cannot load {path} as a module")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module  # what it pickles by reference can be found
            loader_spec.loader.exec_module(module)
            return module
        return importlib.import_module(spec)
    except Exception as e:
        raise PreloadError(f"--preload {spec!r}: cannot import it: {describe(e)}") from e


def _hook(module: ModuleType, names: tuple[str, ...]) -> Any:
    for name in names:
        fn = getattr(module, name, None)
        if fn is not None:
            return fn
    return None


async def _call(fn: Any, server: Any) -> None:
    callback = getattr(fn, "callback", None)
    if callback is not None and hasattr(fn, "make_context"):  # a click command (Dask)
        ctx = fn.make_context(fn.name or "preload", [], resilient_parsing=False)
        result = callback(server, **ctx.params)
    else:
        result = fn(server)
    if inspect.isawaitable(result):
        await result


class Preloads:
    """The ``--preload`` modules of one process, imported when made (so that a bad one
    stops the process before it serves anything)."""

    def __init__(self, specs: Sequence[str]):
        self.modules = [(spec, import_preload(spec)) for spec in specs]

    async def setup(self, server: Any) -> None:
        for spec, module in self.modules:
            fn = _hook(module, SETUP_NAMES)
            if fn is None:
                continue
            try:
                await _call(fn, server)
            except Exception as e:
                logger.exception("preload %r failed in its setup", spec)
                raise PreloadError(f"--preload {spec!r}: its setup raised {describe(e)}") from e

    async def teardown(self, server: Any) -> None:
        """Every module's teardown, last first; a failure is logged, the others still run."""
        for spec, module in reversed(self.modules):
            fn = _hook(module, TEARDOWN_NAMES)
            if fn is None:
                continue
            try:
                await _call(fn, server)
            except Exception:
                logger.exception("preload %r failed in its teardown", spec)
