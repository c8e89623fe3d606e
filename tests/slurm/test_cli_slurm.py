"""`gpubudget slurm sync-accounts` refuses bad input before touching Slurm."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "slurm", *args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/nonexistent", "SLURM_CONF": "/nonexistent"})


def test_bad_budgets_file_names_the_line_and_runs_nothing(tmp_path):
    bad = tmp_path / "budgets.yaml"
    bad.write_text("accounts:\n  physics:\n    grant: lots\n")
    p = run("sync-accounts", f"--budgets={bad}")
    assert p.returncode == 2
    assert "budgets.yaml:3: accounts.physics.grant" in p.stderr, p.stderr


def test_missing_budgets_file_and_unreachable_slurm_are_clear_errors(tmp_path):
    p = run("sync-accounts", f"--budgets={tmp_path / 'nope.yaml'}")
    assert p.returncode == 2 and "cannot read" in p.stderr
    ok = tmp_path / "budgets.yaml"
    ok.write_text("accounts:\n  lab: {grant: 1, members: [ana]}\n")
    p = run("sync-accounts", f"--budgets={ok}")  # no sacctmgr on this PATH
    assert p.returncode == 1 and "sacctmgr" in p.stderr, p.stderr
