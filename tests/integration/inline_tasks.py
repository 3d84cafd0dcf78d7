"""Tasks for test_inline_results (importable by the workers)."""

from __future__ import annotations

import os


def sized_bytes(n: int) -> bytes:
    return b"x" * n


def fails_if_exists(path: str, value: int) -> int:
    """``value`` the first time; raises once ``path`` exists (a recomputation)."""
    if os.path.exists(path):
        raise ValueError(f"recomputed after {path} appeared")
    return value


class Unloadable:
    """Pickled by reference to a module the client's copy of which is missing it."""
