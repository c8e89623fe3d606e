"""A real JupyterHub and the real gpubudget service (as in tests/service), and real Jupyter
servers running the gpubudget server extension with a user's token, as JupyterHub would."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.fixtures.jupyter import start_jupyter

# what the demo hub gives a single-user server's token (hub_config/jupyterhub_config.py)
SERVER_SCOPES = ["custom:gpubudget:read", "custom:gpubudget:submit",
                 "access:services!service=gpubudget"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"))
    yield h
    h.stop()


@pytest.fixture(scope="module")
def service(hub, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def root(hub):
    return hub.token("root")


@pytest.fixture(scope="module")
def server_token(hub):
    """bob's single-user server's token."""
    return hub.token("bob", scopes=SERVER_SCOPES)


def wait_state(svc: ServiceProc, token: str, sid: str, state: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st, s = http("GET", f"{svc.api}/sessions/{sid}?wait=2", token)
        assert st == 200, s
        if s["state"] == state:  # type: ignore[index]
            return s  # type: ignore[return-value]
        assert time.monotonic() < deadline, s
        time.sleep(0.1)


@pytest.fixture(scope="module")
def session(service, root):
    """A running session of bob's (1 of the 2 GPUs), as BudgetSpawner would have queued it."""
    st, s = http("POST", f"{service.api}/sessions", root,
                 {"user": "bob", "project": "lattice", "slice": "gpu:1", "min_runtime": "2h"})
    assert st == 201, s
    return wait_state(service, root, s["id"], "running")  # type: ignore[index]


@pytest.fixture(scope="module")
def lab(service, session, server_token, tmp_path_factory):
    j = start_jupyter(tmp_path_factory.mktemp("jupyter"), {
        "GPUBUDGET_URL": service.base, "JUPYTERHUB_API_TOKEN": server_token,
        "GPUBUDGET_SESSION": session["id"], "GPUBUDGET_PROJECT": "lattice"})
    yield j
    j.stop()
