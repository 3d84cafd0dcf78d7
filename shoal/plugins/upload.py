"""``client.upload_file``: a worker plugin that carries a file's bytes to every worker
(those running and those joining later), as Dask's ``UploadFile``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from shoal.plugins.base import WorkerPlugin

# Files a worker can import from once they are on ``sys.path``.
IMPORTABLE = (".py", ".egg", ".zip", ".whl")


class UploadFile(WorkerPlugin):
    """Write ``filename``'s bytes into each worker's local directory; a ``.py`` file's
    directory (an ``.egg``/``.zip``/``.whl`` itself) goes on ``sys.path``, and with
    ``load`` a ``.py`` module is imported (reloaded if it was imported before; an
    archive's packages are importable by tasks, whose names only they know)."""

    idempotent = False

    def __init__(self, filename: str | os.PathLike[str], load: bool = True):
        path = os.fspath(filename)
        with open(path, "rb") as f:
            self.data = f.read()
        self.filename = os.path.basename(path)
        self.load = load
        self.name = f"upload-file-{self.filename}"

    def setup(self, worker: Any) -> None:
        directory = os.path.join(worker.local_directory, "uploads")
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, self.filename)
        tmp = f"{target}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.data)
        os.replace(tmp, target)  # a task importing it never sees half a file
        base, ext = os.path.splitext(self.filename)
        if ext not in IMPORTABLE:
            return
        entry = directory if ext == ".py" else target
        if entry not in sys.path:
            sys.path.insert(0, entry)
        importlib.invalidate_caches()
        if self.load and ext == ".py":
            if base in sys.modules:
                importlib.reload(sys.modules[base])
            else:
                importlib.import_module(base)
