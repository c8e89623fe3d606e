"""Helpers for the snapshot suites that run the project's own demo hub (real JupyterHub,
configurable-http-proxy, the gpubudget service, BudgetSpawner, jupyterhub-singleuser with the
gpubudget server extension, real ipykernel kernels).

Kernels are reached the way the notebook page reaches them: the notebook is opened through
the server's REST API (a session), and code runs in its kernel over the kernel's own
channels (its connection file, in the user's runtime directory)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from jupyter_client import BlockingKernelClient

from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import DemoHub, http

NOTEBOOK = {"cells": [], "metadata": {"kernelspec": {"name": "python3",
                                                     "display_name": "Python 3"}},
            "nbformat": 4, "nbformat_minor": 5}


def wait(pred, what: str, hub: DemoHub, timeout: float = 90, every: float = 0.25):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:  # why the core keeps work waiting, then the log
            st, queue = http("GET", hub.svc + "/queue", hub.token)
            raise AssertionError(f"{what}\nqueue ({st}): {json.dumps(queue)[:3000]}\n"
                                 f"{hub.logtail(9000)}")
        time.sleep(every)


def user_token(hub: DemoHub, user: str) -> str:
    st, out = http("POST", f"{hub.api}/users/{user}/tokens", hub.token,
                   {"note": "snapshot test", "expires_in": 3600})
    assert st == 201, out
    return out["token"]  # type: ignore[index]


def sessions(hub: DemoHub, user: str) -> list[dict]:
    st, out = http("GET", hub.svc + f"/sessions?user={user}", hub.token)
    assert st == 200, out
    return out["sessions"]  # type: ignore[index]


def session(hub: DemoHub, sid: str) -> dict:
    st, out = http("GET", hub.svc + f"/sessions/{sid}", hub.token)
    assert st == 200, out
    return out  # type: ignore[return-value]


def server_model(hub: DemoHub, user: str) -> dict | None:
    st, u = http("GET", f"{hub.api}/users/{user}", hub.token)
    assert st == 200, u
    return (u.get("servers") or {}).get("")  # type: ignore[union-attr]


def ready_session_id(hub: DemoHub, user: str, not_: str | None = None,
                     timeout: float = 120) -> str:
    """The gpubudget session of the user's server once the hub says it is ready."""
    def ready() -> str | None:
        sv = server_model(hub, user)
        if not sv or not sv.get("ready"):
            return None
        sid = (sv.get("state") or {}).get("gpubudget_session")
        return sid if sid and sid != not_ else None

    return wait(ready, f"{user}'s server not ready", hub, timeout)


class Notebook:
    """A notebook open in the user's server, and its kernel."""

    def __init__(self, hub: DemoHub, user: str, token: str, path: str = "work.ipynb") -> None:
        self.hub, self.user, self.token, self.path = hub, user, token, path
        self.base = f"{hub.url}/user/{user}/"

    def api(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        return http(method, self.base + path, self.token, body)

    def open(self) -> str:
        st, out = self.api("PUT", f"api/contents/{self.path}",
                           {"type": "notebook", "content": NOTEBOOK})
        assert st in (200, 201), out
        st, out = self.api("POST", "api/sessions", {"path": self.path, "type": "notebook",
                                                    "name": self.path,
                                                    "kernel": {"name": "python3"}})
        assert st == 201, out
        return out["kernel"]["id"]  # type: ignore[index]

    def kernel_id(self) -> str | None:
        st, out = self.api("GET", "api/sessions")
        assert st == 200, out
        for s in out:  # type: ignore[union-attr]
            if s["path"] == self.path:
                return s["kernel"]["id"]
        return None

    def client(self) -> BlockingKernelClient:
        kid = self.kernel_id()
        assert kid, f"no kernel attached to {self.path}"
        # the server's own home (as root the demo runs it as the user's own Unix account)
        home = Path(self.hub.server_env(self.user).get("HOME")
                    or self.hub.dir / "state" / "home" / self.user)
        conn = home / ".local" / "share" / "jupyter" / "runtime" / f"kernel-{kid}.json"
        wait(conn.exists, f"no connection file {conn}", self.hub, 30)
        kc = BlockingKernelClient(connection_file=str(conn))
        kc.load_connection_file()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        return kc

    def run(self, code: str, timeout: float = 300) -> str:
        """Run a cell (stored in the history, like a notebook cell); its printed output.
        Fails with the kernel's error."""
        kc = self.client()
        out: list[str] = []
        try:
            reply = kc.execute_interactive(
                code, timeout=timeout, allow_stdin=False,
                output_hook=lambda m: out.append(m["content"].get("text", ""))
                if m["msg_type"] == "stream" else None)
        finally:
            kc.stop_channels()
        c = reply["content"]
        assert c["status"] == "ok", f"{c.get('ename')}: {c.get('evalue')}"
        return "".join(out)


def ledger(hub: DemoHub) -> Ledger:
    return Ledger(connect(hub.ledger_url, read_only=True))


def job(hub: DemoHub, token: str, project: str, name: str, gpus: int = 1) -> dict:
    st, out = http("POST", hub.svc + "/jobs", token,
                   {"command": "sleep 600", "project": project, "gpus": gpus, "name": name,
                    "min_runtime": "1h"})
    assert st == 201, out
    return out  # type: ignore[return-value]


def job_state(hub: DemoHub, token: str, jid: str) -> str:
    st, out = http("GET", hub.svc + f"/workloads/{jid}", token)
    assert st == 200, out
    return out["state"]  # type: ignore[index]


def stop_everything(hub: DemoHub, users: list[str], tokens: dict[str, str]) -> None:
    for t in tokens.values():
        st, out = http("GET", hub.svc + "/jobs?state=pending,running", t)
        for j in (out or {}).get("jobs", []) if st == 200 else []:  # type: ignore[union-attr]
            http("DELETE", hub.svc + f"/jobs/{j['id']}", t)
    for u in users:
        http("DELETE", f"{hub.api}/users/{u}/server", hub.token)


def write_config(d: Path, budgets: str, inventory: str) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "budgets.yaml").write_text(budgets)
    (d / "inventory.yaml").write_text(inventory)
    return d / "budgets.yaml", d / "inventory.yaml"


def dump(obj: object) -> str:
    return json.dumps(obj, indent=1, default=str)[:6000]


def users_dir(hub, user: str, name: str) -> Path:  # noqa: ANN001
    """A fresh directory the user's server (their own Unix account, as root) may write, in
    their home: what the notebook's cells open."""
    import os
    import uuid

    home = Path(hub.server_env(user).get("HOME") or hub.dir / "state" / "home" / user)
    d = home / f"{name}-{uuid.uuid4().hex[:6]}"
    d.mkdir(parents=True)
    st = home.stat()
    os.chown(d, st.st_uid, st.st_gid)
    return d
