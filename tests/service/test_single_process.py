"""An SQLite ledger has one service process, whatever the ledger is called: a symlink or a
hard link to it, or a path through ``x/../``, reaches the same file and is refused as the
same path is — two services never schedule the same GPUs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_gpubudget.service.app import sqlite_single_process
from tests.fixtures.hub import BUDGETS, wait_http
from tests.fixtures.ports import free_port
from tests.fixtures.replicas import INVENTORY


def spellings(tmp_path) -> dict[str, str]:  # noqa: ANN001
    ledger = tmp_path / "ledger.sqlite"
    ledger.touch()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(ledger, tmp_path / "elsewhere" / "link.sqlite")
    os.link(ledger, tmp_path / "elsewhere" / "hard.sqlite")
    return {"symlink": str(tmp_path / "elsewhere" / "link.sqlite"),
            "hard link": str(tmp_path / "elsewhere" / "hard.sqlite"),
            "x/../": str(tmp_path / "elsewhere" / ".." / "ledger.sqlite"),
            "same path": str(ledger)}


def test_every_name_of_the_ledger_file_meets_the_same_lock(tmp_path):
    names = spellings(tmp_path)
    held = sqlite_single_process(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    try:
        for how, path in names.items():
            with pytest.raises(OSError, match="another gpubudget service process uses this "
                                              "SQLite ledger") as e:
                sqlite_single_process(f"sqlite:///{path}")
            assert "symlink or a hard link" in str(e.value), how
    finally:
        held.close()
    again = sqlite_single_process(f"sqlite:///{names['hard link']}")  # released: usable
    again.close()


def test_a_second_service_through_a_symlink_or_a_hard_link_exits(tmp_path):
    names = spellings(tmp_path)
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "tokens.json").write_text("{}")
    os.chmod(tmp_path / "tokens.json", 0o600)

    def argv(db: str, port: int) -> list[str]:
        return [sys.executable, "-m", "jupyter_gpubudget.service",
                f"--budgets={tmp_path / 'budgets.yaml'}",
                f"--inventory={tmp_path / 'inventory.yaml'}",
                "--GpuBudgetService.inventory_source=declared", f"--db=sqlite:///{db}",
                f"--jobs-dir={tmp_path / 'jobs'}",
                f"--GpuBudgetService.tokens_file={tmp_path / 'tokens.json'}",
                "--ip=127.0.0.1", f"--port={port}"]

    port = free_port()
    first = subprocess.Popen(argv(str(tmp_path / "ledger.sqlite"), port), cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v1/healthz", proc=first)
        for how in ("symlink", "hard link"):
            second = subprocess.run(argv(names[how], free_port()), cwd=tmp_path,
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode == 2, (how, second.stderr[-2000:])
            assert "another gpubudget service process uses this SQLite ledger" in \
                second.stderr, how
            assert first.poll() is None
    finally:
        first.terminate()
        first.wait(15)
