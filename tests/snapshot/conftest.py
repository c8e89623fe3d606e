"""Fixtures for the snapshot suites: a store, real ipykernel kernels, CRIU when it works here.

CRIU comes from ``.ci/build-criu.sh`` (``make criu``: built once into a cache); the suite uses
``$GPUBUDGET_CRIU`` when the Makefile sets it, else whatever ``find_criu`` finds. Without CRIU
or root the CRIU tests skip, except under ``CI=true`` where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_gpubudget.snapshot import kernels
from jupyter_gpubudget.snapshot.criu import find_criu
from jupyter_gpubudget.snapshot.store import Store
from tests.hub.hubproc import require

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    return Store(str(tmp_path / "store"), keep_last=3)


class Kernels:
    """Kernels started by a test; all stopped at its end (restored ones too)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.running: list = []

    def start(self, name: str, session: str = "w1", project: str = "lattice"):  # noqa: ANN201
        km, ref = kernels.start_kernel(str(self.base / name), session=session, project=project)
        self.running.append((ref, km))
        return km, ref

    def adopt(self, ref) -> None:  # noqa: ANN001
        self.running.append((ref, None))

    def run(self, ref, code: str, timeout: float = 60) -> kernels.Reply:  # noqa: ANN001
        kc = kernels.client(ref)
        try:
            return kernels.execute(kc, code, timeout=timeout)
        finally:
            kc.stop_channels()

    def close(self) -> None:
        for ref, km in self.running:
            kernels.stop_kernel(ref, km)


@pytest.fixture
def kernelset(tmp_path):
    ks = Kernels(tmp_path / "kernels")
    yield ks
    ks.close()


def criu_binary() -> str | None:
    found = find_criu(os.environ.get("GPUBUDGET_CRIU"))
    if found is None and os.environ.get("CI") == "true":
        # CI's `make test` builds it first; a direct pytest run under CI=true builds it here
        p = subprocess.run(["bash", str(REPO / ".ci" / "build-criu.sh")], capture_output=True,
                           text=True)
        found = p.stdout.strip() if p.returncode == 0 else None
    return found


@pytest.fixture(scope="session")
def criu_bin():
    require(os.geteuid() == 0, "root (CRIU dumps and restores need it)")
    found = criu_binary()
    require(found is not None, "CRIU >= 4.1 (make criu)")
    require(shutil.which("nft") is not None, "nftables (CRIU's network lock)")
    os.environ["GPUBUDGET_CRIU"] = found
    return found
