"""The gpubudget server extension's snapshots, with real Jupyter servers, real kernels, the real
service (and its real JupyterHub for tokens), as BudgetSpawner would run them.

- "snapshot now" and a restore into the running server, recorded at the service;
- a corrupted snapshot is detected at start-up, reported (at the service, in the restore
  report), not used, and the previous one is restored instead;
- kernels end themselves when their server is killed outright, and a server that adopted a
  CRIU-restored kernel owns it (it is not ended while that server lives);
- hostile requests are refused with the field named."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from jupyter_client import BlockingKernelClient

from jupyter_gpubudget.snapshot import chunkio
from jupyter_gpubudget.snapshot.store import Store
from tests.fixtures.hub import http
from tests.fixtures.jupyter import JupyterServer, start_jupyter
from tests.serverext import conftest as _sx

# the real hub, service and a running session of bob's (tests/serverext's fixtures)
hub, service, root, server_token, session = (_sx.hub, _sx.service, _sx.root, _sx.server_token,
                                             _sx.session)

NB = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


class Server:
    def __init__(self, j: JupyterServer) -> None:
        self.j = j

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        st, out, _ = self.j.call("POST", path, body=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
        return st, out  # type: ignore[return-value]

    def open(self, path: str) -> str:
        (self.j.dir / "work" / path).write_text(json.dumps(NB))
        st, s = self.post("api/sessions", {"path": path, "type": "notebook", "name": path,
                                           "kernel": {"name": "python3"}})
        assert st == 201, s
        return s["kernel"]["id"]

    def kernel_of(self, path: str) -> str | None:
        st, ss, _ = self.j.call("GET", "api/sessions")
        return next((s["kernel"]["id"] for s in ss if s["path"] == path), None)  # type: ignore[union-attr]

    def run(self, path: str, code: str) -> str:
        kid = self.kernel_of(path)
        assert kid, f"no kernel for {path}"
        kc = BlockingKernelClient(connection_file=str(self.j.dir / "runtime" / f"kernel-{kid}.json"))
        kc.load_connection_file()
        kc.start_channels()
        out: list[str] = []
        try:
            kc.wait_for_ready(timeout=60)
            r = kc.execute_interactive(code, timeout=120, output_hook=lambda m: out.append(
                m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
        finally:
            kc.stop_channels()
        assert r["content"]["status"] == "ok", r["content"]
        return "".join(out)

    def pid_of(self, path: str) -> int:
        return int(self.run(path, "import os; print(os.getpid())"))

    def restored(self, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            st, rs, _ = self.j.call("GET", "gpubudget/api/restore")
            assert st == 200, rs
            if rs["state"] != "restoring":  # type: ignore[index]
                return rs  # type: ignore[return-value]
            assert time.monotonic() < deadline, self.j.logtail()
            time.sleep(0.2)


def methods() -> list[str]:
    from jupyter_gpubudget.snapshot.criu import find_criu

    out = ["namespace"]
    if os.geteuid() == 0 and (find_criu() or os.environ.get("CI") == "true"):
        out.append("criu")
    return out


@pytest.fixture
def env(service, session, server_token, tmp_path):
    return {"GPUBUDGET_URL": service.base, "JUPYTERHUB_API_TOKEN": server_token,
            "GPUBUDGET_SESSION": session["id"], "GPUBUDGET_PROJECT": "lattice",
            "GPUBUDGET_SNAPSHOT_DIR": str(tmp_path / "store")}


WATCHDOG_S = 6.0


def start(d: Path, env: dict, method: str, **more: str) -> Server:
    e = {**env, "GPUBUDGET_SNAPSHOT_METHODS": method, **more}
    if method == "criu":
        from .conftest import criu_binary

        e["GPUBUDGET_CRIU"] = criu_binary() or ""
    return Server(start_jupyter(d, e, config={
        "GpuBudgetSnapshots": {"kernel_watchdog": WATCHDOG_S}}))


@pytest.mark.parametrize("method", methods())
def test_snapshot_now_then_restore_in_the_running_server(method, env, service, root,
                                                         session, tmp_path):
    s = start(tmp_path / "srv", env, method)
    try:
        s.open("a.ipynb")
        s.run("a.ipynb", "import numpy as np\nv = np.arange(1000)\ntag = 'first'")
        st, snap = s.post("gpubudget/api/snapshots", {"reason": "user"})
        assert st == 200, snap
        assert snap["saved"] == 1 and snap["methods"] == [method] and snap["status"] == "ok"
        assert snap["members"][0]["sessions"][0]["path"] == "a.ipynb"
        s.run("a.ipynb", "v[:] = 0\ntag = 'changed'")  # "snapshot now" left it running
        st, rep = s.post("gpubudget/api/restore", {"snapshot": snap["id"]})
        assert st == 200, rep
        assert rep["kernels"][0]["notebooks"] == ["a.ipynb"]
        assert s.run("a.ipynb", "print(tag, int(v.sum()))").split() == ["first", "499500"]
        # the service recorded both
        st, mine = http("GET", f"{service.api}/sessions/{session['id']}/snapshots", root)
        assert st == 200 and snap["id"] in [x["id"] for x in mine["snapshots"]], mine
        st, sj = http("GET", f"{service.api}/sessions/{session['id']}", root)
        assert sj["restored"]["snapshot"] == snap["id"], sj
    finally:
        s.j.stop()


@pytest.mark.parametrize("method", methods())
def test_a_corrupted_snapshot_is_reported_not_used_and_the_previous_one_restores(
        method, env, service, root, session, tmp_path):
    a = start(tmp_path / "a", env, method)
    try:
        a.open("nb.ipynb")
        a.run("nb.ipynb", "import numpy as np\nx = np.full(300_000, 1.0)\nword = 'first'")
        st, first = a.post("gpubudget/api/snapshots", {"reason": "user"})
        assert st == 200, first
        a.run("nb.ipynb", "x[:] = 2.0\nword = 'second'")
        st, second = a.post("gpubudget/api/snapshots", {"reason": "preempt"})
        assert st == 200, second
    finally:
        a.j.stop()
    # corrupt the newest snapshot: truncate its largest chunk of its own
    store = Store(env["GPUBUDGET_SNAPSHOT_DIR"], keep_last=0)
    mine = store.load(second["members"][0]["snapshot"])["chunks"]
    older = {r[0] for r in store.load(first["members"][0]["snapshot"])["chunks"]}
    ref = max((r for r in mine if r[0] not in older), key=lambda r: r[1])
    path = chunkio.chunk_path(store.chunk_root, ref[0], ref[2])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)

    b = start(tmp_path / "b", env, method, GPUBUDGET_RESTORE=second["id"])
    try:
        rs = b.restored()
        assert rs["state"] == "done", rs
        rep = rs["report"]
        assert rep["snapshot"] == first["id"] and rep["asked"] == second["id"]
        assert rep["skipped"][0]["id"] == second["id"] and rep["skipped"][0]["problem"]
        assert f"failed verification; used {first['id']}" in rep["summary"]
        out = b.run("nb.ipynb", "print(word, float(x.sum()))").split()
        assert out == ["first", str(300_000.0)]
        # reported at the service: the bad snapshot is listed bad with the problem, and the
        # session's restore report says which one was used
        st, bad = http("GET", f"{service.api}/snapshots/{second['id']}", root)
        assert st == 200 and bad["status"] == "bad" and bad["problem"], bad
        st, sj = http("GET", f"{service.api}/sessions/{session['id']}", root)
        assert sj["restored"]["snapshot"] == first["id"]
        assert sj["restored"]["skipped"][0]["id"] == second["id"]
    finally:
        b.j.stop()
    # and it stays unused: listed bad in the store, never deleted silently
    assert os.path.exists(path)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.parametrize("method", methods())
def test_kernels_end_when_their_server_is_killed_and_adoption_moves_ownership(
        method, env, tmp_path):
    a = start(tmp_path / "a", env, method)
    a.open("k.ipynb")
    a.run("k.ipynb", "n = 7")
    pid = a.pid_of("k.ipynb")
    if method == "namespace":
        a.j.proc.send_signal(signal.SIGKILL)  # no clean shutdown of its kernels
        a.j.proc.wait()
        assert _gone(pid, WATCHDOG_S + 30), f"kernel {pid} outlived its killed server"
        return
    st, snap = a.post("gpubudget/api/snapshots", {"reason": "preempt"})
    assert st == 200 and snap["saved"] == 1, snap
    a.j.proc.send_signal(signal.SIGKILL)
    a.j.proc.wait()
    b = start(tmp_path / "b", env, method, GPUBUDGET_RESTORE=snap["id"])
    try:
        assert b.restored()["state"] == "done"
        assert b.pid_of("k.ipynb") == pid  # CRIU: the same process, adopted by b
        time.sleep(WATCHDOG_S + 6)  # longer than the watchdog's grace after a died
        assert b.run("k.ipynb", "print(n)").strip() == "7"
        b.j.proc.send_signal(signal.SIGKILL)
        b.j.proc.wait()
        assert _gone(pid, WATCHDOG_S + 30), \
            f"restored kernel {pid} outlived the server that adopted it"
    finally:
        b.j.stop()


def test_hostile_requests_are_refused_with_the_field(env, tmp_path):
    s = start(tmp_path / "srv", env, "namespace")
    try:
        for path, body, field in [
            ("gpubudget/api/snapshots", {"reason": "because"}, "reason"),
            ("gpubudget/api/snapshots", {"freeze": "yes"}, "freeze"),
            ("gpubudget/api/snapshots", {"deadline": "soon"}, "deadline"),
            ("gpubudget/api/snapshots", {"merge": "../../etc"}, "merge"),
            ("gpubudget/api/restore", {"snapshot": "../x"}, "snapshot"),
            ("gpubudget/api/restore", {}, "snapshot"),
        ]:
            st, out = s.post(path, body)
            assert st == 400 and out["message"].startswith(field + ":"), (body, out)
        st, out, _ = s.j.call("POST", "gpubudget/api/snapshots", auth="none",
                              body=b"{}", headers={"Content-Type": "application/json"})
        assert st == 403, out
    finally:
        s.j.stop()


def test_self_snapshot_from_inside_the_server_as_a_prestop_hook(env, tmp_path):
    import subprocess
    import sys

    s = start(tmp_path / "srv", env, "namespace")
    try:
        s.open("p.ipynb")
        s.run("p.ipynb", "z = 99")
        e = {**os.environ, "JUPYTERHUB_SERVICE_URL": s.j.url.replace("127.0.0.1", "0.0.0.0"),
             "JUPYTERHUB_API_TOKEN": s.j.token}

        def self_snapshot() -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "snapshot",
                                   "--self"], env=e, capture_output=True, text=True, timeout=300)

        p = self_snapshot()
        assert p.returncode == 0 and "1 of 1 kernels saved" in p.stdout, p.stdout + p.stderr
        st, status, _ = s.j.call("GET", "gpubudget/api/snapshots")
        assert status["kernels"] == 0 and status["last"]["reason"] == "preempt"  # ended
        p = self_snapshot()  # already saved (e.g. by BudgetSpawner): nothing to do
        assert p.returncode == 0 and "nothing to save" in p.stdout, p.stdout + p.stderr
    finally:
        s.j.stop()


def test_a_refused_criu_dump_falls_back_to_the_namespace_and_the_kernel_runs_on(
        env, tmp_path):
    """CRIU is offered but its dump is refused (the privileged side acts for another account,
    as a misconfigured or hostile set-up would): the kernel is not left stopped, and the
    namespace method saves it instead (it used to answer 'partial, saved 0')."""
    from .conftest import criu_binary

    if "criu" not in methods():
        require_criu = pytest.fail if os.environ.get("CI") == "true" else pytest.skip
        require_criu("CRIU and root are needed for this test")
    e = {**env, "GPUBUDGET_SNAPSHOT_METHODS": "criu,namespace",
         "GPUBUDGET_CRIU": criu_binary() or ""}
    s = Server(start_jupyter(tmp_path / "srv", e, config={
        "GpuBudgetSnapshots": {"kernel_watchdog": WATCHDOG_S},
        "Privileged": {"command_prefix": ["env", "SUDO_UID=65534"]}}))
    try:
        s.open("a.ipynb")
        s.run("a.ipynb", "tag = 'kept'")
        st, snap = s.post("gpubudget/api/snapshots", {"reason": "user"})
        assert st == 200, snap
        assert snap["saved"] == 1 and snap["status"] == "ok", snap
        assert snap["members"][0]["method"] == "namespace", snap
        assert any(w.startswith("criu: ") and "65534" in w
                   for w in snap["members"][0]["why_not"]), snap
        assert s.run("a.ipynb", "print(tag)").strip() == "kept"  # running, not stopped
    finally:
        s.j.stop()
