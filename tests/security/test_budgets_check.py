"""Security review (low): ``gpubudget budgets check`` gave tracebacks for a non-UTF-8 file,
``grant: 1e400`` and 500-deep ``children:``, and hung on an alias bomb (1.2 GB, > 60 s), a
10,000-long ``parent:`` chain (> 30 s) and a 10 MB file (> 300 s); a 400-digit ``window`` read
as "inf days". Each now gets a clear ``file:line`` error (bench/budgets_check.py measures the
time and memory: well under 2 s and 200 MB each)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .hostile_budgets import write_all


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_all(tmp_path_factory.mktemp("budgets"))


@pytest.mark.parametrize("name", ["non-utf8", "grant-1e400", "grant-huge-float",
                                  "grant-400-digits", "grant-5000-digits", "children-500-deep",
                                  "alias-bomb", "parent-chain-10000", "ten-megabytes",
                                  "window-400-digits", "window-400-digit-seconds"])
def test_hostile_budgets_files_get_a_clear_error(files, name):
    path, line = files[name]
    r = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "budgets", "check",
                        str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    where = f"{path}:{line}:" if line is not None else f"{path}:"
    assert r.stderr.startswith(f"error: {where}"), r.stderr
    assert len(r.stderr) < 1000, r.stderr  # one clear line, not an echo of the input
