"""Transparent checkpoints of batch jobs (``checkpoint: auto``) with the real CRIU and the real
privileged launcher, as root, jobs running as a test account in their cgroups.

Two launchers with their own jobs roots stand for two nodes. A job counts in a loop, printing
each number and keeping the count in memory only; it is checkpointed at a random moment on one
node and restored on the other, and must go on from where it stopped (not from 0), with its
output continuing in the new attempt's log. The local backend does the same on a preemption:
its ``stop`` checkpoints a resumable job into the snapshot store, its next ``launch`` restores
it; the charge ends when the job was ended after its dump. A job that cannot be dumped (a
process that left its tree with ``setsid``; an internet socket) falls back to the signal and
says why in its log.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from jupyter_gpubudget.snapshot.criu import find_criu
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp
from tests.security.conftest import require_root

PY = sys.executable
BOB = PREFIX + "bob"
#: counts for ever, one number a line; the count lives in memory only
COUNTER = ("import sys, time\n"
           "i = 0\n"
           "while True:\n"
           "    print(i, flush=True)\n"
           "    i += 1\n"
           "    time.sleep(0.02)\n")


@pytest.fixture(scope="module")
def nodes():
    require_root()
    if find_criu() is None:
        pytest.fail("CRIU >= 4.1 is needed (make criu; GPUBUDGET_CRIU)")
    demo_setup.ensure_service_user()
    ensure_accounts(["bob"])
    out = []
    for name in ("node-a", "node-b"):
        base = shared_tmp(f"gpubudget-ckpt-{name}-")
        jobs = base / "jobs"
        cfg = demo_setup.launcher_config(base, jobs, demo_setup.SERVICE_USER)
        out.append({"base": base, "jobs": jobs, "cfg": cfg})
    return out


#: a way to stop each job launched: called after each test, whatever happened
LAUNCHED: list = []


@pytest.fixture(autouse=True)
def _stop_jobs():
    yield
    while LAUNCHED:
        try:
            LAUNCHED.pop()()
        except Exception:  # noqa: BLE001, S110 - it may have ended already
            pass


def launcher(cfg: Path, verb: str, *args: str, spec: dict | None = None) -> tuple[int, dict]:
    if verb == "launch" and spec:
        LAUNCHED.append(lambda w=spec["workload"], n=spec["attempt"]: launcher(
            cfg, "signal", w, str(n), "1"))
    r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(cfg),
                        verb, *args], input=json.dumps(spec or {}).encode(),
                       capture_output=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    try:
        return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"no answer: {r.stdout!r} {r.stderr!r}") from None


def counts(path: Path) -> list[int]:
    return [int(x) for x in re.findall(r"^(\d+)$", path.read_text(), re.M)]


def wait_for(cond, timeout: float = 30.0):  # noqa: ANN001
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def spec(wid: str, attempt: int, command: list[str] | None = None, **kw: object) -> dict:
    return {"workload": wid, "attempt": attempt, "user": BOB,
            "command": command or ["/usr/bin/python3", "-c", COUNTER], "grace": 2, **kw}


def test_a_counting_job_resumes_its_count_on_another_node(nodes):
    a, b = nodes
    wid = f"ck{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec=spec(wid, 1))
    assert rc == 0, out
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 5)
    time.sleep(random.uniform(0.2, 1.5))  # a random point of its count
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    before = counts(log1)
    time.sleep(0.3)
    assert counts(log1) == before  # stopped while its images are stored
    rc, end = launcher(a["cfg"], "checkpoint-end", wid, "1", "kill")
    assert rc == 0 and end["ended"], end
    assert end["exit"]["checkpointed"] is True
    last = counts(log1)[-1]
    try:
        rc, out = launcher(b["cfg"], "launch", spec=spec(
            wid, 2, restore={"images_dir": ck["images_dir"], "log": str(log1)}))
        assert rc == 0, out
        log2 = b["jobs"] / wid / "2" / "output.log"
        wait_for(lambda: len(counts(log2)) > 5)
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    resumed = counts(log2)
    assert resumed[0] == last + 1, (last, resumed[:5])  # where it stopped, not from 0
    assert resumed == list(range(last + 1, last + 1 + len(resumed)))
    assert counts(log1)[-1] == last  # the old attempt's log is left as it was
    # it runs as bob in the new attempt's cgroup, and the launcher stops it as any job
    pid = json.loads((b["jobs"] / wid / "2" / "pid").read_text())
    cg = Path(pid["cgroup"])
    assert pid["pid"] in [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    assert os.stat(f"/proc/{pid['pid']}").st_uid == pid["uid"] != 0
    rc, sig = launcher(b["cfg"], "signal", wid, "2", "2")
    assert rc == 0 and sig["signalled"], sig
    assert sig["exit"]["checkpointed"] is False
    assert "restored the checkpointed job" in (b["jobs"] / wid / "2" / "launcher.log").read_text()


def test_a_job_that_left_its_tree_is_not_dumped_and_says_why(nodes):
    a, _ = nodes
    wid = f"cs{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec=spec(
        wid, 1, ["/bin/sh", "-c", "(setsid sleep 300 &); echo started; sleep 300"]))
    assert rc == 0, out
    log = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: "started" in log.read_text())
    time.sleep(0.3)
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"] is False, ck
    assert "left the job's process tree" in ck["reason"]
    assert "could not be checkpointed" in log.read_text()
    assert "not checkpointed" in (a["jobs"] / wid / "1" / "launcher.log").read_text()
    assert not (a["jobs"] / wid / "1" / "checkpointing").exists()
    rc, sig = launcher(a["cfg"], "signal", wid, "1", "1")  # the fallback: signal, as before
    assert rc == 0 and sig["signalled"] and sig["exit"]["checkpointed"] is False


def test_a_job_with_an_internet_socket_falls_back(nodes):
    a, _ = nodes
    wid = f"cn{os.getpid():x}"
    code = ("import socket, time\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.connect(('192.0.2.1', 9))\n"
            "print('connected', flush=True)\n"
            "time.sleep(300)\n")
    rc, out = launcher(a["cfg"], "launch", spec=spec(wid, 1, ["/usr/bin/python3", "-c", code]))
    assert rc == 0, out
    log = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: "connected" in log.read_text())
    rc, ck = launcher(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"] is False, ck
    assert "udp socket" in ck["reason"]
    rc, sig = launcher(a["cfg"], "signal", wid, "1", "1")
    assert rc == 0 and sig["signalled"]


# ------------------------------------------------------------------ the local backend
def _backend(jobs: Path, store: Path):  # noqa: ANN202
    from jupyter_gpubudget.backends.local import LocalBackend
    from tests.fixtures.unixusers import TEMPLATE

    b = LocalBackend(state_dir=str(jobs), checkpoint_store=str(store),
                     unix_user_template=TEMPLATE, stop_grace=2)
    real = b.launch

    def launch(launch):  # noqa: ANN001, ANN202 - stopped after the test, whatever happened
        LAUNCHED.append(lambda: b._launcher("signal", launch.workload, str(launch.attempt),
                                            "1"))
        return real(launch)

    b.launch = launch
    return b


def _launch(wid: str, attempt: int, env: dict | None = None, resumable: bool = True):  # noqa: ANN202
    from jupyter_gpubudget.backends.base import Launch

    return Launch(wid, attempt, "bob", "lattice", ["/usr/bin/python3", "-c", COUNTER], [],
                  env=env or {}, resumable=resumable)


def test_the_backend_checkpoints_a_preempted_job_and_restores_it_on_another_node(nodes):
    """What the service's loop does on a preemption of a resumable job (``stop``) and on its
    next start (``launch`` of the next attempt, here on another node's backend)."""
    require_root()
    base = shared_tmp("gpubudget-ckpt-backend-")
    store = base / "store"
    node_a, node_b = _backend(base / "a", store), _backend(base / "b", store)
    wid = f"cb{os.getpid():x}"
    node_a.launch(_launch(wid, 1))
    log1 = base / "a" / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 5)
    time.sleep(random.uniform(0.1, 2.0))  # preempted at a random point of its count
    asked = time.time()
    st = node_a.stop(wid, 1)
    back = time.time()
    assert not st.alive
    # the charge of attempt 1 ends when its tree was ended after its dump: within the stop
    assert st.ended_at is not None and asked <= st.ended_at <= back
    exit1 = json.loads((base / "a" / wid / "1" / "exit").read_text())
    assert exit1["checkpointed"] is True and exit1["ended_at"] == st.ended_at
    last = counts(log1)[-1]
    assert node_a._checkpoints.store.list(session=f"job-{wid}")  # in the snapshot store
    node_b.launch(_launch(wid, 2))
    log2 = base / "b" / wid / "2" / "output.log"
    wait_for(lambda: len(counts(log2)) > 5)
    resumed = counts(log2)
    assert resumed[0] == last + 1, (last, resumed[:5])  # not from 0
    # attempt 2 is charged from its own start, after attempt 1's end: never twice
    started = node_b.started(wid, 2)
    assert started is not None and started[1] >= st.ended_at
    assert not node_b._checkpoints.store.list(session=f"job-{wid}")  # used, removed
    st2 = node_b.stop(wid, 2)  # checkpointed again (a second preemption)
    assert not st2.alive
    assert json.loads((base / "b" / wid / "2" / "exit").read_text())["checkpointed"] is True
    node_b._checkpoints.drop(wid)


def test_checkpoint_self_keeps_the_signal(nodes):
    base = shared_tmp("gpubudget-ckpt-self-")
    node = _backend(base / "a", base / "store")
    wid = f"cf{os.getpid():x}"
    node.launch(_launch(wid, 1, env={"GPUBUDGET_CHECKPOINT": "self"}))
    log1 = base / "a" / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 2)
    st = node.stop(wid, 1)
    assert not st.alive
    exit1 = json.loads((base / "a" / wid / "1" / "exit").read_text())
    assert exit1["checkpointed"] is False and exit1["signal"] == 15  # SIGTERM, as before
    assert not node._checkpoints.store.list(session=f"job-{wid}")
    env = (base / "a" / wid / "1" / "launcher.log").read_text()
    assert "checkpointed" not in env


def test_the_checkpoint_field_is_checked():
    from jupyter_gpubudget.service.validate import Invalid, parse_job

    job = {"command": "python3 train.py", "project": "p", "resumable": True}
    assert parse_job(job)["env"] == {}  # auto: the default for a resumable job
    assert parse_job({**job, "checkpoint": "self"})["env"] == {"GPUBUDGET_CHECKPOINT": "self"}
    for bad, why in (({**job, "checkpoint": "yes"}, "expected 'auto'"),
                     ({**job, "resumable": False, "checkpoint": "auto"}, "resumable")):
        with pytest.raises(Invalid, match=why) as e:
            parse_job(bad)
        assert e.value.field == "checkpoint"


def test_a_job_holding_a_gpu_is_toggled_by_cuda_checkpoint(nodes, tmp_path):
    """GPU state goes through ``cuda-checkpoint --toggle`` around the dump and after the
    restore. No GPU here: the job maps a file named ``libcuda.so.1`` (what the helper looks
    for), and ``cuda-checkpoint`` is a STAND-IN script that records its calls."""
    a, b = nodes
    lib = shared_tmp("gpubudget-fake-cuda-") / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    lib.chmod(0o644)
    calls = tmp_path / "calls"
    tool = tmp_path / "cuda-checkpoint"
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    tool.chmod(0o755)
    code = (f"import mmap\nf = open({str(lib)!r}, 'rb')\n"
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n" + COUNTER)
    wid = f"cg{os.getpid():x}"
    env = {"PATH": "/usr/bin:/bin", "GPUBUDGET_CUDA_CHECKPOINT": str(tool)}

    def run(cfg: Path, verb: str, *args: str, spec: dict | None = None) -> dict:
        if verb == "launch" and spec:
            LAUNCHED.append(lambda w=spec["workload"], n=spec["attempt"]: launcher(
                cfg, "signal", w, str(n), "1"))
        r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(cfg),
                            verb, *args], input=json.dumps(spec or {}).encode(),
                           capture_output=True, timeout=120, env=env)
        return json.loads(r.stdout.decode().strip().splitlines()[-1])

    run(a["cfg"], "launch", spec=spec(wid, 1, ["/usr/bin/python3", "-c", code]))
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 5)
    ck = run(a["cfg"], "checkpoint", wid, "1")
    assert ck["checkpointed"] and ck["gpu"] is True, ck
    pid = ck["pid"]
    # taken off the GPU before the dump, given back after it (it stays stopped meanwhile)
    assert calls.read_text().split("\n")[:2] == [f"--toggle --pid {pid}"] * 2
    run(a["cfg"], "checkpoint-end", wid, "1", "kill")
    last = counts(log1)[-1]
    try:
        out = run(b["cfg"], "launch", spec=spec(
            wid, 2, ["/usr/bin/python3", "-c", code],
            restore={"images_dir": ck["images_dir"], "log": str(log1), "gpu": True}))
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    log2 = b["jobs"] / wid / "2" / "output.log"
    wait_for(lambda: len(counts(log2)) > 2)
    assert counts(log2)[0] == last + 1
    assert calls.read_text().split("\n")[2] == f"--toggle --pid {out['pid']}"  # back on it
    run(b["cfg"], "signal", wid, "2", "1")
