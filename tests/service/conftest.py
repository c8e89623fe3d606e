"""One real JupyterHub for the service tests; the gpubudget service runs as a real process
registered with it as an external service (so tests can kill -9 and restart it)."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from tests.fixtures.hub import ServiceProc, http, start_hub
from tests.fixtures.postgres import postgres_server  # noqa: F401


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    h = start_hub(tmp_path_factory.mktemp("hub"))
    yield h
    h.stop()


@pytest.fixture(scope="session")
def tokens(hub):
    return {u: hub.token(u) for u in ("root", "alice", "bob", "dave", "erin", "mallory")}


def cleanup(svc: ServiceProc, admin_token: str | None) -> None:
    """Cancel whatever is still pending, stop the service, stop jobs still running."""
    if admin_token and svc.proc is not None and svc.proc.poll() is None:
        status, body = http("GET", svc.api + "/queue", admin_token)
        for e in (body or {}).get("queue", []) if status == 200 else []:
            http("DELETE", f"{svc.api}/jobs/{e['id']}", admin_token)
    svc.stop()
    jobs = LocalBackend(state_dir=str(svc.dir / "jobs"), stop_grace=2)
    for wid, attempt in jobs.orphans(set()):  # nothing outlives the test
        jobs.stop(wid, attempt)


@pytest.fixture(scope="module")
def service(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc")
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield svc
    cleanup(svc, tokens["root"])
