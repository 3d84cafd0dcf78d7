"""The leak check in conftest.py is real: it fails a test that leaves a child
process, a thread or a socket behind (and cleans the process up)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.timeout(60)

LEAKY_TESTS = """
import socket
import subprocess
import sys
import threading
import time


def test_clean_popen():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)


def test_leaves_popen_running(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    (tmp_path.parent.parent / "leaked.pid").write_text(str(p.pid))


def test_leaves_a_thread():
    threading.Thread(target=time.sleep, args=(3,), name="leaky-thread").start()


LISTENERS = []


def test_leaves_a_socket():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    LISTENERS.append(s)
"""


def test_leak_check_fails_leaky_tests(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    shutil.copy(Path(__file__).with_name("conftest.py"), inner / "conftest.py")
    shutil.copy(Path(__file__).with_name("subprocess_env.py"), inner / "subprocess_env.py")
    (inner / "test_leaky.py").write_text(LEAKY_TESTS)
    env = {**os.environ, "SHOAL_TEST_LEAK_GRACE": "0.5"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rE",
            f"--basetemp={tmp_path / 'base'}",
            str(inner),
        ],
        cwd=inner,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "4 passed, 3 errors" in out, out
    assert "ERROR test_leaky.py::test_leaves_popen_running" in out, out
    assert "leaked child processes" in out and "time.sleep(60)" in out, out
    assert "ERROR test_leaky.py::test_leaves_a_thread" in out, out
    assert "leaky-thread" in out, out
    assert "ERROR test_leaky.py::test_leaves_a_socket" in out, out
    assert "LISTEN" in out, out
    # the check killed the leaked process
    pid = int((tmp_path / "leaked.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
