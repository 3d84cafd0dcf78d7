"""Layering: shoal/core and shoal/protocol stay pure (DESIGN.md, "Layers").

They import nothing from asyncio, socket, threading or time (time enters as a field of
an event), nor shoal's configuration. Imports are found with ``ast`` at any depth:
inside functions, classes, ``if``/``try`` blocks, ``from x import y``, dotted and
relative imports, and ``__import__``/``importlib.import_module`` with a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shoal

SHOAL = Path(shoal.__file__).resolve().parent
PURE_PACKAGES = ("core", "protocol")
FORBIDDEN = ("asyncio", "socket", "threading", "time", "shoal.config")


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """Every module named by an import in ``source`` (the code of ``module``, a dotted
    name, used to resolve relative imports), as (line, absolute dotted name).

    ``from a import b`` yields both ``a`` and ``a.b``, since ``b`` may be a module."""
    package = module.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                name = f"{base}.{node.module}" if node.module else base
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(source: str, module: str) -> list[str]:
    out = []
    for line, name in imported_modules(source, module):
        for bad in FORBIDDEN:
            if name == bad or name.startswith(bad + "."):
                out.append(f"{module}:{line} imports {name}")
                break
    return out


def pure_modules() -> list[tuple[str, Path]]:
    modules = []
    for package in PURE_PACKAGES:
        for path in sorted((SHOAL / package).rglob("*.py")):
            # "shoal.core.__init__" keeps its suffix: relative imports in it resolve
            # against "shoal.core", as they should.
            name = ".".join(path.relative_to(SHOAL.parent).with_suffix("").parts)
            modules.append((name, path))
    return modules


def test_pure_packages_are_found():
    names = {name for name, _ in pure_modules()}
    assert {
        "shoal.protocol.messages",
        "shoal.protocol.framing",
        "shoal.protocol.serialize",
        "shoal.core.__init__",
    } <= names


@pytest.mark.parametrize("module, path", pure_modules(), ids=[name for name, _ in pure_modules()])
def test_core_and_protocol_stay_pure(module, path):
    assert violations(path.read_text(encoding="utf-8"), module) == []


# --- the checker itself catches violations ----------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio",
        "import asyncio.events",
        "import os, time as clock",
        "from time import monotonic",
        "from threading import Lock as L",
        "from asyncio.events import get_event_loop",
        "import socket\n",
        "def f():\n    import time\n    return time.time()",
        "class A:\n    def m(self):\n        if True:\n            from socket import socket",
        "try:\n    pass\nexcept ImportError:\n    import threading",
        "from shoal import config",
        "from shoal.config import get",
        "from .. import config",
        "from ..config import get",
        "__import__('time')",
        "import importlib\nimportlib.import_module('asyncio')",
    ],
)
def test_checker_detects_violations(source):
    assert violations(source, "shoal.core.story")


@pytest.mark.parametrize(
    "source",
    [
        "import os",
        "import timeit",
        "import asyncio_compat",
        "from datetime import time",
        "from shoal.protocol.messages import Key",
        "from . import story",
        "from .time_utils import x",
        "from ..protocol import framing",
        "x = 'import time'",
        "# import time",
    ],
)
def test_checker_allows_clean_code(source):
    assert violations(source, "shoal.core.story") == []


def test_relative_imports_resolve_against_the_package():
    assert (1, "shoal.core.story") in imported_modules("from . import story", "shoal.core.x")
    assert (1, "shoal.config") in imported_modules("from .. import config", "shoal.core.x")
    # in a package's __init__, "." is the package itself
    found = imported_modules("from .config import x", "shoal.__init__")
    assert (1, "shoal.config") in found
