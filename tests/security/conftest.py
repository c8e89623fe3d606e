"""The security suite: each test replays an attack from the security review against the real service
(a real process registered with a real JupyterHub) or the real demo hub, and fails if the
attack still works.

Most of it needs root (Unix accounts are created, jobs run as other users): without root it
is skipped, except with CI=true where that is a failure (tests.hub.hubproc.require)."""

from __future__ import annotations

import os

import pytest

from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.hub.hubproc import require
from tests.service.conftest import cleanup


def require_root() -> None:
    require(os.geteuid() == 0, "root (the suite creates Unix accounts and runs jobs as them)")


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("sechub"))
    yield h
    h.stop()


@pytest.fixture(scope="session")
def tokens(hub):
    return {u: hub.token(u) for u in ("root", "alice", "bob", "dave", "erin", "mallory")}


@pytest.fixture
def service_factory(hub, tokens, tmp_path_factory):
    """Start services with extra arguments; every one is stopped (and its jobs) at the end."""
    started: list[ServiceProc] = []

    def make(*extra: str, db_url: str | None = None, directory=None, budgets: str | None = None,
             inventory: str | None = None, cycle: float = 0.3) -> ServiceProc:
        d = directory or tmp_path_factory.mktemp("secsvc")
        if budgets is not None:
            (d / "budgets.yaml").write_text(budgets)
        if inventory is not None:
            (d / "inventory.yaml").write_text(inventory)
        svc = ServiceProc(hub, d, db_url or f"sqlite:///{d / 'ledger.sqlite'}",
                          cycle_interval=cycle, extra_args=list(extra))
        svc.start()
        started.append(svc)
        return svc

    yield make
    for svc in started:
        cleanup(svc, tokens["root"])


def wait_state(svc: ServiceProc, token: str, wid: str, states: tuple[str, ...],
               timeout: float = 30.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while True:
        w = http("GET", f"{svc.api}/workloads/{wid}", token)[1]
        if isinstance(w, dict) and w.get("state") in states:
            return w
        assert time.monotonic() < deadline, f"{wid} never reached {states}: {w}"
        time.sleep(0.1)
