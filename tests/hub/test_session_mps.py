"""Notebook sessions on MPS shares: BudgetSpawner holds the GPU's MPS control daemon
(hub/mps.py) from before the server starts until every way it ends, and the watcher starts a
dead one again.

The real ``BudgetSpawner.start`` / ``poll`` / ``stop`` and watcher run; what stands in: the
service's session endpoints (``Service``: a new session is granted its placement at once), the
server (``Server``: records the environment it was given), NVML (tests/inventory/fake_nvml.py
for real-looking GPU UUIDs), and ``nvidia-cuda-mps-control`` and the driver probe
(tests/backends/test_mps.py's ``fake`` fixture: the stand-in program records every call)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from jupyterhub.spawner import Spawner

from jupyter_gpubudget.backends.mps import MpsUnavailable
from jupyter_gpubudget.hub import mps as hubmps
from jupyter_gpubudget.hub.spawner import BudgetSpawner
from jupyter_gpubudget.inventory.nvml import discover
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from ..backends.test_mps import FAKE, fake  # noqa: F401 - the fixture
from ..inventory.fake_nvml import FakeNvml, hgx_h200

ROOT = Path(__file__).resolve().parents[2]


def share(gpu: int = 0, milli: int = 250) -> dict:
    return {"node": "n1", "gpu": gpu, "kind": "mps", "milli": milli, "mig_start": -1,
            "profile": None, "gpu_memory_mib": 0}


class Service:
    """The service's session endpoints as the spawner calls them: a new session is granted
    ``placement`` at once; a heartbeat answers what ``heartbeat`` says."""

    def __init__(self, placement: list[dict], inventory: str = "nvml") -> None:
        self.placement, self.inventory = placement, inventory
        self.sessions: dict[str, dict] = {}
        self.heartbeat: dict = {}

    async def __call__(self, method: str, path: str, body: object = None,
                       headers: dict | None = None) -> dict:
        if (method, path) == ("POST", "/sessions"):
            sid = f"s{len(self.sessions) + 1}"
            self.sessions[sid] = {"id": sid, "state": "running", "project": "astro",
                                  "placement": self.placement, "inventory": self.inventory}
            return dict(self.sessions[sid])
        sid, _, rest = path.removeprefix("/sessions/").partition("/")
        sid, _, query = sid.partition("?")
        sess = self.sessions[sid]
        if method == "DELETE":
            sess["state"], sess["reason"] = "ended", query.removeprefix("reason=")
        elif rest == "heartbeat":
            sess.update(self.heartbeat)
        return dict(sess)


class Server(Spawner):
    """Stands in for the backend spawner: the server 'runs' from start until stop (or until
    a test ends it), with the environment it was given."""

    fail = False

    async def start(self) -> tuple[str, int]:
        if self.fail:
            raise RuntimeError("the server did not start")
        self.running, self.seen = True, dict(self.environment)
        return "127.0.0.1", 8888

    async def poll(self) -> int | None:
        return 0 if not getattr(self, "running", False) else None

    async def stop(self, now: bool = False) -> None:
        self.running = False

    def get_state(self) -> dict:
        return {"pid": 4242}


@pytest.fixture
def hub(fake, monkeypatch):  # noqa: F811
    """The fake daemon program on PATH and its driver probe; a fresh hub process's daemons."""
    monkeypatch.setattr(hubmps, "DRIVER_PROBE", fake.driver)
    hubmps._daemons.clear()
    yield fake
    hubmps._daemons.clear()


def spawner(fake, service: Service, user: str = "alice", **kw: object) -> BudgetSpawner:  # noqa: ANN001, F811
    kw = {"heartbeat_interval": 3600, "idle_limit": 0, "snapshot_on_preempt": False, **kw}
    sp = BudgetSpawner(user=types.SimpleNamespace(name=user, url=f"/user/{user}/"),
                       backend_spawner_class=Server, mps_state_dir=str(fake.root), **kw)
    sp.user_options = {"project": "astro", "slice": "mps:250"}
    sp.api = service  # type: ignore[method-assign]
    sp._discovery = discover(FakeNvml(hgx_h200()), node_name="n1")
    return sp


async def wait_for(pred, timeout: float = 20.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def daemon_alive(fake, gpu: str = "GPU-fake-00") -> bool:  # noqa: ANN001, F811
    return fake.daemons().alive(gpu)


def quits(fake, gpu: str = "GPU-fake-00") -> int:  # noqa: ANN001, F811
    log = fake.root / gpu / "log" / "control.log"
    return log.read_text().count("command quit") if log.exists() else 0


async def test_sessions_on_one_gpu_share_its_daemon_until_the_last_ends(hub):
    service = Service([share(0, 250)])
    a = spawner(hub, service)
    await a.start()
    (daemon,) = hub.calls("daemon")
    pipe = str(hub.root / "GPU-fake-00" / "pipe")
    assert daemon["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-fake-00"
    assert daemon["env"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert a.child is not None
    env = a.child.seen
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-fake-00"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert hub.daemons().holders("GPU-fake-00") == {"session-s1"}

    b = spawner(hub, service, user="bob")
    await b.start()
    assert len(hub.calls("daemon")) == 1  # the same daemon
    assert b.child.seen["CUDA_MPS_PIPE_DIRECTORY"] == pipe
    assert hub.daemons().holders("GPU-fake-00") == {"session-s1", "session-s2"}

    await a.stop()
    assert service.sessions["s1"]["state"] == "ended"
    assert daemon_alive(hub) and quits(hub) == 0
    assert hub.daemons().holders("GPU-fake-00") == {"session-s2"}

    # the hub restarts: a new process, the spawner from the hub's database
    state = b.get_state()
    hubmps._daemons.clear()
    b2 = spawner(hub, service, user="bob")
    b2.load_state(state)
    assert b2.session_id == "s2"
    await b2.stop()
    assert not daemon_alive(hub) and quits(hub) == 1
    assert hub.daemons().holders("GPU-fake-00") == set()
    assert len(hub.calls("daemon")) == 1
    await b2.stop()  # idempotent
    assert quits(hub) == 1
    b._watch_task.cancel()  # the old hub process is gone


async def test_a_server_that_exits_lets_go_when_poll_sees_it(hub):
    service = Service([share(2, 500)])
    sp = spawner(hub, service)
    await sp.start()
    assert sp.child.seen["CUDA_VISIBLE_DEVICES"] == "GPU-fake-02"
    assert await sp.poll() is None and daemon_alive(hub, "GPU-fake-02")
    sp.child.running = False  # the server exited
    assert await sp.poll() == 0
    assert not daemon_alive(hub, "GPU-fake-02") and quits(hub, "GPU-fake-02") == 1
    assert service.sessions["s1"]["state"] == "ended"


async def test_the_watcher_starts_a_dead_daemon_again(hub):
    service = Service([share(0)])
    sp = spawner(hub, service, heartbeat_interval=0.05)
    await sp.start()
    try:
        (first,) = hub.calls("daemon")
        os.kill(first["pid"], signal.SIGKILL)
        await wait_for(lambda: len(hub.calls("daemon")) == 2)
        again = hub.calls("daemon")[1]
        assert again["pid"] != first["pid"]
        assert again["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-fake-00"
        assert again["env"]["CUDA_MPS_PIPE_DIRECTORY"] == sp.child.seen["CUDA_MPS_PIPE_DIRECTORY"]
        await wait_for(lambda: daemon_alive(hub))
        assert hub.daemons().holders("GPU-fake-00") == {"session-s1"}
    finally:
        await sp.stop()
    assert not daemon_alive(hub) and quits(hub) == 1


@pytest.mark.parametrize("heartbeat", [
    {"state": "ended"},  # the service ended the session (the watcher stops the server)
    {"preempt_requested": "backed work"},  # restore.preempt stops it
])
async def test_a_server_the_watcher_stops_lets_go(hub, heartbeat):
    service = Service([share(0)])
    sp = spawner(hub, service, heartbeat_interval=0.05)
    await sp.start()
    assert daemon_alive(hub)
    service.heartbeat = {**heartbeat, "preempt_deadline": time.time()}
    await wait_for(lambda: not sp.child.running)
    await wait_for(lambda: quits(hub) == 1)
    assert not daemon_alive(hub) and hub.daemons().holders("GPU-fake-00") == set()
    await sp.stop()
    assert quits(hub) == 1


@pytest.mark.parametrize("missing", ["program", "driver"])
async def test_without_the_program_or_driver_the_start_fails_saying_why(hub, monkeypatch,
                                                                      tmp_path, missing):
    if missing == "program":
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        why = ("MPS share on GPU-fake-00: MPS shares need the NVIDIA MPS control daemon: "
               "'nvidia-cuda-mps-control' is not found on PATH (/usr/bin:/bin)")
    else:
        monkeypatch.setattr(hubmps, "DRIVER_PROBE", tmp_path / "no-driver")
        why = (f"MPS share on GPU-fake-00: MPS shares need an NVIDIA driver: "
               f"{tmp_path / 'no-driver'} is missing")
    service = Service([share(0)])
    sp = spawner(hub, service)
    with pytest.raises(MpsUnavailable) as e:
        await sp.start()
    assert str(e.value).startswith(why)
    assert sp.child is None  # no server was started
    assert service.sessions["s1"]["state"] == "ended"
    assert service.sessions["s1"]["reason"] == "failed"
    assert hub.calls() == [] and not hub.root.exists()


async def test_a_declared_inventory_starts_no_daemon(hub):
    service = Service([share(0)], inventory="declared")
    sp = spawner(hub, service)
    await sp.start()
    env = sp.child.seen
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-n1-0"  # a derived id: no GPU behind it
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    await sp.stop()
    assert hub.calls() == [] and not hub.root.exists()


async def test_a_failed_start_lets_go(hub):
    service = Service([share(0)])
    sp = spawner(hub, service)
    sp._construct_child().fail = True
    with pytest.raises(RuntimeError, match="the server did not start"):
        await sp.start()
    assert len(hub.calls("daemon")) == 1  # it was started for the server ...
    assert not daemon_alive(hub) and quits(hub) == 1  # ... and stopped with its failure
    assert hub.daemons().holders("GPU-fake-00") == set()
    assert service.sessions["s1"]["reason"] == "failed"


async def test_a_start_cancelled_while_the_daemon_starts_holds_nothing(hub):
    # the daemon takes a while to come up: the spawn is cancelled meanwhile
    prog = hub.bin / "nvidia-cuda-mps-control"
    shutil.copy(FAKE, hub.bin / "fake_mps_control.py")
    prog.write_text(f'#!/bin/sh\n[ "$1" = -d ] && sleep 1\nexec {sys.executable} '
                    f'{hub.bin / "fake_mps_control.py"} "$@"\n')
    service = Service([share(0)])
    sp = spawner(hub, service)
    start = asyncio.ensure_future(sp.start())
    await wait_for(lambda: (hub.root / "GPU-fake-00").is_dir())
    start.cancel()
    with pytest.raises(asyncio.CancelledError):
        await start
    await wait_for(lambda: len(hub.calls("daemon")) == 1)  # it came up after all ...
    await wait_for(lambda: quits(hub) == 1)  # ... and was let go of
    assert not daemon_alive(hub) and hub.daemons().holders("GPU-fake-00") == set()
    assert sp.child is None


# ------------------------------------------------------------------ an unprivileged hub
UNPRIVILEGED = """
import asyncio, json, sys, types
sys.path.insert(0, {root!r})
from jupyterhub.spawner import LocalProcessSpawner
from jupyter_gpubudget.hub import mps
from jupyter_gpubudget.hub.spawner import BudgetSpawner
from jupyter_gpubudget.inventory.nvml import discover
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

class SudoSpawner(LocalProcessSpawner):  # servers run as their users through sudo
    pass

mps.DRIVER_PROBE = {driver!r}
disc = discover(FakeNvml(hgx_h200()), node_name="n1")
out = {{}}
for name, cls in (("sudo", SudoSpawner), ("own", LocalProcessSpawner)):
    sp = BudgetSpawner(user=types.SimpleNamespace(name="alice"), backend_spawner_class=cls,
                       mps_state_dir={state!r})
    sp.session_id = "s-" + name
    try:
        out[name] = asyncio.run(mps.acquire(sp, [{share!r}], disc))
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)
    asyncio.run(mps.release(sp))
print(json.dumps(out))
"""


def test_an_unprivileged_hub():
    """With SudoSpawner (servers as other users) the start is refused, saying why; with a
    spawner that runs servers as the hub's own user the daemon runs as that user."""
    d = shared_tmp("gpubudget-hubmps-")
    (d / "bin").mkdir()
    shutil.copy(FAKE, d / "bin" / "nvidia-cuda-mps-control")
    (d / "bin" / "nvidia-cuda-mps-control").chmod(0o755)
    (d / "driver").write_text("NVRM version: stand-in\n")
    script = UNPRIVILEGED.format(root=str(ROOT), driver=str(d / "driver"),
                                 state=str(d / "mps"), share=share(0))
    argv = [sys.executable, "-c", script]
    if os.geteuid() == 0:  # the hub as an unprivileged account
        ensure_accounts(["mpshub"])
        shutil.chown(d, PREFIX + "mpshub")
        for p in d.rglob("*"):
            shutil.chown(p, PREFIX + "mpshub")
        argv = ["setpriv", f"--reuid={PREFIX}mpshub", f"--regid={PREFIX}mpshub",
                "--init-groups", "--", *argv]
    env = {**os.environ, "PATH": f"{d / 'bin'}:/usr/bin:/bin"}
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=d, timeout=120)
    finally:
        calls = [json.loads(x) for x in (d / "bin" / "calls.jsonl").read_text().splitlines()] \
            if (d / "bin" / "calls.jsonl").exists() else []
        for c in calls:
            if c["what"] == "daemon":
                try:
                    os.kill(c["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["sudo"].startswith(
        "MpsUnavailable: MPS share on GPU-fake-00: MPS shares of notebook servers that run as "
        "other users (SudoSpawner) need the MPS control daemon to run as root"), out
    assert "this hub runs unprivileged" in out["sudo"]
    assert out["own"] == {"GPU-fake-00": str(d / "mps" / "GPU-fake-00" / "pipe")}
    (daemon,) = [c for c in calls if c["what"] == "daemon"]  # only for the own user's spawner
    assert daemon["uid"] == os.stat(d).st_uid  # the hub's own user
    assert (d / "mps" / "GPU-fake-00" / "pipe").stat().st_mode & 0o077 == 0  # 0700: its own
    assert "command quit" in (d / "mps" / "GPU-fake-00" / "log" / "control.log").read_text()
