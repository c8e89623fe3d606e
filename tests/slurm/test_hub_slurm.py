"""Through a real JupyterHub running the project's own hub_config/jupyterhub_config.slurm.py
(the gpubudget service managed by the hub, BudgetSpawner wrapping batchspawner's SlurmSpawner)
against the real test Slurm cluster:

- the inventory is Slurm's nodes and typed GRES; the accounts were created by sync-accounts;
- a 2-node gang batch job runs on the core's chosen nodes with the right GRES;
- a notebook's server runs inside a Slurm job, as its user, and JupyterLab answers;
- a 3-GPU gang beside it is a heterogeneous job matching the core's per-node placement; a
  backed job preempts it (scancel) and it is requeued and starts again as its next attempt;
- a node that dies is drained by the core in Slurm and stays drained when it comes back,
  until an admin returns it to service;
- every charge interval of the ledger matches sacct within one cycle interval, and the
  service's own reconciliation finds no mismatch.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.slurm_map import parse_sacct
from jupyter_gpubudget.ledger import Ledger, connect
from tests.hub.hubproc import DemoHub, free_port, http, launch_hub, require_hub_parts

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "hub_config" / "jupyterhub_config.slurm.py"
CYCLE = 5.0  # the service's cycle interval in this test (seconds)


def start_slurm_hub(d: Path, budgets: Path, cluster) -> DemoHub:  # noqa: ANN001
    require_hub_parts()
    try:
        import batchspawner  # noqa: F401
    except ImportError:
        from tests.hub.hubproc import require

        require(False, "batchspawner (pip install '.[slurm]')")
    d.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    e = dict(cluster.env)
    e.update({
        "GPUBUDGET_HUB_DIR": str(d / "state"), "GPUBUDGET_BUDGETS": str(budgets),
        "GPUBUDGET_HUB_PORT": str(port), "GPUBUDGET_SERVICE_PORT": str(free_port()),
        "GPUBUDGET_PROXY_API_PORT": str(free_port()), "GPUBUDGET_HUB_API_PORT": str(free_port()),
        "GPUBUDGET_TEST_TOKEN": token, "GPUBUDGET_CYCLE_INTERVAL": str(CYCLE),
        "GPUBUDGET_QUEUE_POLL": "0.3", "GPUBUDGET_HEARTBEAT": "2", "GPUBUDGET_POLL_INTERVAL": "5",
        "GPUBUDGET_AUTHENTICATOR": "dummy", "GPUBUDGET_CLEANUP_SERVERS": "1",
        "GPUBUDGET_SLURM_GPU_MODELS": json.dumps({"h100": "H100-80GB"}),
        "GPUBUDGET_SLURM_NODE_ADDRS": json.dumps({n.name: "127.0.0.1" for n in cluster.nodes}),
        "GPUBUDGET_SLURM_SUDO_KEEP_CONF": "1", "GPUBUDGET_SERVER_IP": "127.0.0.1",
        "GPUBUDGET_SLURM_UNRESPONSIVE_GRACE": "2", "GPUBUDGET_SLURM_USAGE_CHECK": str(CYCLE),
        "GPUBUDGET_SLURM_USAGE_THRESHOLD": str(CYCLE), "GPUBUDGET_SLURM_WATCH": "0.5",
        "GPUBUDGET_SLURM_JOB_BIN": str(cluster.job_python()),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    })
    return launch_hub([sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)], d, e, port,
                      token)


@pytest.fixture(scope="module")
def hub(slurm_accounts):
    # a private directory: pytest's shared basetemp may be pruned by other sessions
    d = Path(tempfile.mkdtemp(prefix="gpubudget-slurmhub-"))
    h = start_slurm_hub(d, slurm_accounts.budgets, slurm_accounts)
    h.cluster = slurm_accounts
    h.tokens = {}
    yield h
    h.stop()
    if os.environ.get("GPUBUDGET_KEEP_TEST_DIRS") != "1":
        shutil.rmtree(d, ignore_errors=True)
    for n in slurm_accounts.nodes:  # leave the cluster as the next module expects it
        slurm_accounts.run("scontrol", "update", f"nodename={n.name}", "state=resume",
                           check=False)


def token(hub, user: str) -> str:
    if user not in hub.tokens:
        st, out = http("POST", f"{hub.api}/users/{user}/tokens", hub.token, {"note": "slurm"})
        assert st == 201, out
        hub.tokens[user] = out["token"]
    return hub.tokens[user]


def wait_for(pred, timeout: float, what: str, hub=None):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(0.25)
    tail = ""
    if hub is not None:  # why the core keeps work waiting, then the hub's log
        st, queue = http("GET", hub.svc + "/queue", hub.token)
        tail = f"queue ({st}): {json.dumps(queue, indent=1)[:3000]}\n{hub.logtail(3000)}"
    raise AssertionError(f"timed out after {timeout}s: {what} (last: {last!r})\n{tail}")


def submit(hub, user: str, **job) -> dict:
    st, out = http("POST", hub.svc + "/jobs", token(hub, user), job)
    assert st == 201, out
    return out


def workload(hub, wid: str) -> dict:
    st, out = http("GET", f"{hub.svc}/workloads/{wid}", hub.token)
    assert st == 200, out
    return out


def state_is(hub, wid: str, *states: str):  # noqa: ANN201
    w = workload(hub, wid)
    return w if w["state"] in states else None


def sacct(hub, name: str) -> list:
    env = dict(hub.cluster.env, SLURM_TIME_FORMAT="%s")
    p = subprocess.run(["sacct", "-X", "-n", "-P", "--format=JobID,JobName,State,ExitCode,"
                        "Start,End,NodeList,User,AllocTRES", "--starttime=now-1days",
                        "--endtime=now", f"--name={name}"], env=env, capture_output=True,
                       text=True, timeout=30, check=True)
    return parse_sacct(p.stdout)


def squeue(hub) -> list[dict]:
    out = hub.cluster.run("squeue", "-h", "-o", "%i|%j|%T|%u|%N|%b")
    return [dict(zip(("id", "name", "state", "user", "nodes", "gres"), line.split("|"),
                     strict=False)) for line in out.splitlines() if line.strip()]


def placement_gres(placement: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in placement:
        out[s["node"]] = out.get(s["node"], 0) + 1
    return out


# ---------------------------------------------------------------------------- tests


def test_accounts_came_from_the_budgets_tree(hub):
    c = hub.cluster
    assocs = c.run("sacctmgr", "-n", "-P", "show", "associations",
                   "format=Account,ParentName,User")
    rows = {tuple(line.split("|")) for line in assocs.splitlines()}
    assert {("gpubudget", "root", ""), ("physics", "gpubudget", ""),
            ("lattice", "physics", ""), ("astro", "physics", ""),
            ("scratch", "gpubudget", "")} <= rows
    assert {("lattice", "", "gpb-ana"), ("astro", "", "gpb-ben"),
            ("scratch", "", "gpb-ben")} <= rows
    assert "sacctmgr -i add account lattice parent=physics" in c.sync_output
    again = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "slurm",
                            "sync-accounts", f"--budgets={c.budgets}"], env=c.env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already match" in again.stdout, again.stdout


def test_inventory_is_slurms_nodes(hub):
    st, offer = http("GET", hub.svc + "/sessions/offer?user=gpb-ana", hub.token)
    assert st == 200, offer
    assert offer["inventory"] == "slurm" and offer["inventory_gpus"] == 4
    assert "gpu:2" in [c["key"] for c in offer["choices"]]


def test_two_node_gang_runs_on_the_cores_nodes_with_the_right_gres(hub):
    job = submit(hub, "gpb-ana", project="lattice", gpus=4, time_limit="10m", name="gang",
                 command="srun --ntasks=2 --ntasks-per-node=1 sh -c "
                         "'echo $SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES user=$(id -un)'")
    w = wait_for(lambda: state_is(hub, job["id"], "done", "failed"), 60, "the gang ends", hub)
    assert w["state"] == "done", w
    assert placement_gres(w["placement"]) == {"gpu1": 2, "gpu2": 2}
    (rec,) = sacct(hub, f"gpubudget.{job['id']}.1")
    assert rec.state == "COMPLETED" and rec.user == "gpb-ana"
    assert rec.nodes == "gpu[1-2]"
    assert "gres/gpu:h100=4" in rec.gres  # typed GRES, 2 per node
    home = Path(pwd.getpwnam("gpb-ana").pw_dir)
    out = (home / f"gpubudget-gpubudget.{job['id']}.1-{rec.job_id}.out").read_text()
    assert sorted(out.split("\n")[:2]) == ["gpu1 gpus=0,1 user=gpb-ana",
                                           "gpu2 gpus=0,1 user=gpb-ana"], out


def test_notebook_server_runs_inside_a_slurm_job_and_jupyterlab_answers(hub):
    st, out = http("POST", f"{hub.api}/users/gpb-ana/server", hub.token,
                   {"project": "lattice", "slice": "gpu:1", "min_runtime": "1h"})
    assert st in (201, 202), out
    hub.wait_ready("gpb-ana", timeout=120)
    st, sessions = http("GET", hub.svc + "/sessions?user=gpb-ana&state=running", hub.token)
    (sess,) = [s for s in sessions["sessions"] if s["state"] == "running"]
    node = sess["placement"][0]["node"]
    jobs = [j for j in squeue(hub) if j["name"] == f"gpubudget.{sess['id']}"]
    assert len(jobs) == 1, squeue(hub)
    j = jobs[0]
    assert j["state"] == "RUNNING" and j["user"] == "gpb-ana" and j["nodes"] == node
    assert j["gres"] == "gres:gpu:h100:1"
    # the server process is in that job, as the user, with Slurm's GPU
    uid = pwd.getpwnam("gpb-ana").pw_uid
    procs = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            envb = (p / "environ").read_bytes()
        except OSError:
            continue
        if b"jupyterhub-singleuser" in cmd and f"SLURM_JOB_ID={j['id']}".encode() in envb:
            procs.append((p.stat().st_uid, dict(kv.split("=", 1) for kv in
                                                envb.decode(errors="replace").split("\0")
                                                if "=" in kv)))
    assert procs, "no single-user server process in the Slurm job"
    assert all(u == uid for u, _ in procs)
    assert procs[0][1].get("CUDA_VISIBLE_DEVICES") == "0"
    assert procs[0][1].get("GPUBUDGET_SESSION") == sess["id"]
    tok = token(hub, "gpb-ana")
    st, status = http("GET", f"{hub.url}/user/gpb-ana/api/status", tok)
    assert st == 200 and "started" in status, status
    st, page = http("GET", f"{hub.url}/user/gpb-ana/lab", tok)
    assert st == 200 and "JupyterLab" in page, str(page)[:300]
    hub.notebook = sess


def test_uneven_gang_is_a_heterogeneous_job_and_a_preempted_resumable_job_restarts(hub):
    # unbacked (project scratch has no grant), resumable, 3 GPUs beside the notebook's one:
    # the core splits it 1 + 2 over the nodes -> two Slurm components
    victim = submit(hub, "gpb-ben", project="scratch", gpus=3, resumable=True,
                    time_limit="20m", name="victim", command="sleep 600")
    wait_for(lambda: state_is(hub, victim["id"], "running"), 30, "the victim starts", hub)
    w = workload(hub, victim["id"])
    per_node = placement_gres(w["placement"])
    assert sorted(per_node.values()) == [1, 2] and not w["backed"]
    name1 = f"gpubudget.{victim['id']}.1"
    comps = wait_for(lambda: [j for j in squeue(hub) if j["name"] == name1
                              and j["state"] == "RUNNING"] if len(
        [j for j in squeue(hub) if j["name"] == name1 and j["state"] == "RUNNING"]) == 2
        else None, 30, "both components run", hub)
    assert {c["nodes"]: c["gres"] for c in comps} == {
        n: f"gres:gpu:h100:{k}" for n, k in per_node.items()}
    assert {c["id"].split("+")[1] for c in comps} == {"0", "1"}
    # a backed job needs 2 GPUs: the unbacked victim is preempted (scancel) and requeued
    # (protected for 20 min: what it gains outweighs the victim's restart, 3 GPUs x 2 min)
    backed = submit(hub, "gpb-ana", project="lattice", gpus=2, time_limit="30m",
                    min_runtime="20m", name="backed", command="sleep 3")
    wait_for(lambda: state_is(hub, backed["id"], "running", "done"), 30, "backed starts", hub)
    v = wait_for(lambda: (x := workload(hub, victim["id"])) and x["preemptions"] >= 1 and x,
                 30, "victim preempted", hub)
    assert v["state"] in ("pending", "running")  # requeued, not lost
    (r1,) = sacct(hub, name1)
    assert r1.state == "CANCELLED"
    wait_for(lambda: state_is(hub, backed["id"], "done"), 30, "backed ends", hub)
    # ... then the victim starts again, as attempt 2
    wait_for(lambda: any(j["name"] == f"gpubudget.{victim['id']}.2" and j["state"] == "RUNNING"
                         for j in squeue(hub)), 30, "the victim's second attempt runs", hub)
    assert workload(hub, victim["id"])["state"] == "running"
    st, out = http("DELETE", f"{hub.svc}/jobs/{victim['id']}", token(hub, "gpb-ben"))
    assert st == 200 and out["state"] == "cancelled", out
    assert not [j for j in squeue(hub) if j["name"].startswith(f"gpubudget.{victim['id']}")
                and j["state"] == "RUNNING"]


def test_a_dead_node_is_drained_by_the_core_and_stays_drained_until_repaired(hub):
    c = hub.cluster
    busy = hub.notebook["placement"][0]["node"]
    dead = "gpu2" if busy == "gpu1" else "gpu1"
    c.stop_node(dead)
    try:
        state, reason = wait_for(lambda: (s := c.node_state(dead)) and "DRAIN" in s[0] and s,
                                 40, f"{dead} drained in Slurm", hub)
        assert reason.startswith("gpubudget: slurm: ") and "NOT_RESPONDING" in reason
    finally:
        c.start_node(dead)
    # back, registered, but still drained: the core keeps it out for repair
    wait_for(lambda: (s := c.node_state(dead)[0]) and "NOT_RESPONDING" not in s
             and "DOWN" not in s and s, 40, f"{dead} registered again", hub)
    assert "DRAIN" in c.node_state(dead)[0]
    job = submit(hub, "gpb-ana", project="lattice", gpus=2, time_limit="5m", name="after",
                 command="hostname")
    time.sleep(3 * CYCLE)
    assert workload(hub, job["id"])["state"] == "pending"  # 1 GPU free on the live node
    c.run("scontrol", "update", f"nodename={dead}", "state=resume")  # the admin repaired it
    w = wait_for(lambda: state_is(hub, job["id"], "done", "failed"), 30, "the job runs", hub)
    assert w["state"] == "done" and placement_gres(w["placement"]) == {dead: 2}
    led = ledger(hub)
    drains = [d for d in led.decisions(kind="drain") if d.detail.get("node") == dead]
    assert drains and "NOT_RESPONDING" in drains[0].reason


def ledger(hub) -> Ledger:
    url = f"sqlite:///{hub.dir / 'state' / 'ledger.sqlite'}"
    return Ledger(connect(url, read_only=True))


def test_ledger_charges_match_sacct_within_one_cycle(hub):
    st, _ = http("DELETE", f"{hub.api}/users/gpb-ana/server", hub.token)
    assert st in (202, 204)
    sid = hub.notebook["id"]
    wait_for(lambda: state_is(hub, sid, "done", "cancelled", "failed"), 60,
             "the session ends", hub)
    led = ledger(hub)
    charges = [c for c in led.charges() if c.end is not None]
    assert len(charges) >= 6  # gang, notebook, victim x2, backed, after
    compared = 0
    for ch in charges:
        row = led.get(ch.workload)
        name = (f"gpubudget.{ch.workload}" if row.backend == "hub"
                else f"gpubudget.{ch.workload}.{ch.seq}")
        recs = sacct(hub, name)
        assert len(recs) == 1, (name, recs)
        r = recs[0]
        assert abs(r.start - ch.start) <= CYCLE, (name, r.start, ch.start)
        assert abs(r.end - ch.end) <= CYCLE, (name, r.end, ch.end)
        compared += 1
    assert compared == len(charges)
    # the service's own reconciliation ran over them and found nothing to report
    last_end = max(c.end for c in charges)
    wait_for(lambda: float(ledger(hub).get_state("usage_checked_until") or 0) >= last_end,
             30, "the usage check passed the last interval", hub)
    assert ledger(hub).decisions(kind="usage-mismatch") == []
