"""Active/standby replicas on one real PostgreSQL ledger, faults at 20 random points.

Three replicas; sessions and jobs are driven through whichever answers (as the hub and the lab
do). At each point the leader is killed (SIGKILL), paused (SIGSTOP, woken with SIGCONT after
another replica took over) or partitioned from the database by its TCP proxy — alternately
dropping every packet (its connections stay open and hang, as in a real partition; the held
bytes arrive after the heal, a late write the fencing token must refuse) and closing its
connections (resets at once). Afterwards:
- every charge interval equals the independent recount — a job's from its launcher's own
  records (when its process started and ended), a session's from when the test (the hub)
  saw it start and ended it — to the second;
- no GPU was ever held by two workloads (the jobs' placements as the launcher gave them);
- scheduling resumed (a scheduling cycle succeeded on a new leader) within 15 s each time.
Each failover is driven (lease 3 s), not waited out.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from jupyter_gpubudget.ledger.models import ChargeRow
from tests.fixtures.hub import http, wait_http
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import Cluster, Replica

N_POINTS = 20
RESUME_LIMIT_S = 15.0
FAULTS = ("kill", "pause", "partition")


@pytest.fixture
def cluster(postgres_server, tmp_path):  # noqa: F811
    url = postgres_server.new_database()
    c = Cluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=3)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        from jupyter_gpubudget.backends.local import LocalBackend

        jobs = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=1)
        for wid, attempt in jobs.orphans(set()):
            jobs.stop(wid, attempt)


def resumed_after(cluster: Cluster, t0: float, old: Replica) -> tuple[Replica, float]:
    """The replica that leads now and the time from ``t0`` until one of its scheduling
    cycles succeeded after it."""
    deadline = time.time() + 60
    while time.time() < deadline:
        for r in cluster.replicas:
            if r is old or r.role() != "leader":
                continue
            status, body = http("GET", r.api + "/healthz", timeout=5)
            ok_at = (body or {}).get("last_ok_cycle_at") if isinstance(body, dict) else None
            if ok_at is not None and ok_at > t0:
                return r, ok_at - t0
        time.sleep(0.02)
    raise AssertionError("scheduling never resumed: " + " | ".join(
        f"{r.name}: {r.log_tail(2000)}" for r in cluster.replicas))


def job_body(rng: random.Random, i: int) -> dict:
    secs = rng.choice([0.5, 1.0, 2.0, 4.0])
    return {"command": ["/bin/sh", "-c", f'echo "$GPUBUDGET_PLACEMENT"; exec sleep {secs}'],
            "project": "lattice", "gpus": rng.choice([1, 1, 2]), "name": f"j{i}",
            "resumable": rng.random() < 0.5}


def test_failover_at_random_points_keeps_the_ledger_exact(cluster):
    rng = random.Random(20270127)
    sessions: dict[str, dict] = {}  # id -> {"seen_running", "checked_at", "end_called", "end_answered"}
    failovers: list[float] = []
    n_jobs = 0
    partitions = 0
    for point in range(N_POINTS):
        # work arrives: jobs, sessions (started by the scheduler, ended by "the hub")
        for _ in range(rng.randint(1, 2)):
            status, out = cluster.call("POST", "/jobs", "bob", job_body(rng, n_jobs),
                                       key=f"job{n_jobs}")
            assert status == 201, out
            n_jobs += 1
        if rng.random() < 0.5:
            status, out = cluster.call("POST", "/sessions", "dave",
                                       {"user": "dave", "project": "astro", "gpus": 1},
                                       key=f"sess{point}")
            assert status == 201, out
            sessions[out["id"]] = {}
        for sid, rec in sessions.items():
            if "end_called" in rec:
                continue
            status, out = cluster.call("GET", f"/sessions/{sid}", "dave")
            if out.get("state") == "running" and "seen_running" not in rec:
                rec["seen_running"] = time.time()
            elif "seen_running" in rec and rng.random() < 0.5:
                rec["end_called"] = time.time()
                status, out = cluster.call("DELETE", f"/sessions/{sid}", "dave")
                assert status == 200, out
                rec["end_answered"] = time.time()
        # the fault, at a random moment of the work in flight
        time.sleep(rng.uniform(0.0, 0.6))
        leader = cluster.wait_leader()
        fault = FAULTS[point % 3] if point < 3 else rng.choice(FAULTS)
        t0 = time.time()
        if fault == "kill":
            leader.kill9()
        elif fault == "pause":
            leader.pause()
        else:
            fault += " (drop)" if partitions % 2 == 0 else " (close)"
            leader.proxy.cut("drop" if partitions % 2 == 0 else "close")
            partitions += 1
        new, took = resumed_after(cluster, t0, leader)
        assert took <= RESUME_LIMIT_S, f"point {point} ({fault}): resumed after {took:.1f} s"
        failovers.append(took)
        # the old leader comes back: restarted, woken (its writes are fenced), reconnected
        if fault == "kill":
            leader.start()
        elif fault == "pause":
            leader.resume()
        else:
            leader.proxy.heal()
        assert cluster.wait_leader() is new, f"point {point}: the lease moved back"
    print(f"failover p50 {sorted(failovers)[len(failovers) // 2]:.2f} s, "
          f"max {max(failovers):.2f} s over {len(failovers)}")

    # drain: end the sessions, let every job run to its end
    for sid, rec in sessions.items():
        if "end_called" not in rec:
            rec["checked_at"] = time.time()
            status, out = cluster.call("GET", f"/sessions/{sid}", "dave")
            if out.get("state") == "running" and "seen_running" not in rec:
                rec["seen_running"] = time.time()
            rec["end_called"] = time.time()
            cluster.call("DELETE", f"/sessions/{sid}", "dave")
            rec["end_answered"] = time.time()
    deadline = time.time() + 120
    while time.time() < deadline:
        status, out = cluster.call("GET", "/jobs?state=pending,running", "bob")
        if status == 200 and not out.get("jobs"):
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"jobs still not done: {out}")

    check_ledger(cluster, sessions)


#: how long after its charge starts a launched attempt may write its pid file
LAUNCH_LATENCY = 5.0


def check_ledger(cluster: Cluster, sessions: dict[str, dict]) -> None:
    url = cluster.replicas[0].db_url.replace(f":{cluster.replicas[0].proxy.port}/",
                                             f":{cluster.pg_port}/")
    engine = connect(url)
    ledger = Ledger(engine)
    try:
        with ledger.ro() as s:
            charges = list(s.query(ChargeRow).order_by(ChargeRow.workload, ChargeRow.seq))
        rows = {r.id: r for r in ledger.workloads()}
    finally:
        engine.dispose()
    assert not [c for c in charges if c.end is None], "open charge intervals left"
    jobs_root = cluster.dir / "jobs"
    held: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    seen_attempts = set()
    for c in charges:
        row = rows[c.workload]
        if row.backend == "local":
            adir = jobs_root / c.workload / str(c.seq)
            seen_attempts.add((c.workload, c.seq))
            pid = adir / "pid"
            if not pid.exists():  # never launched (a stale leader's launch was refused)
                assert c.end - c.start <= 1.0, (c.workload, c.seq, c.start, c.end)
                continue
            started = pid.stat().st_mtime
            ended = json.loads((adir / "exit").read_text())["ended_at"]
            # charged from the decision, launched after it: never started uncharged, and
            # the launch's latency (seconds on a loaded 2-core machine) is the only gap
            assert c.start - 1.0 <= started <= c.start + LAUNCH_LATENCY, (
                c.workload, c.seq, c.start, started)
            assert abs(c.end - ended) <= 1.0, (c.workload, c.seq, c.end, ended)
            placement = json.loads((adir / "output.log").read_text().splitlines()[0])
            for sl in placement:
                held.setdefault((sl["node"], sl["gpu"]), []).append((started, ended, c.workload))
        else:
            rec = sessions[c.workload]
            if "seen_running" in rec:
                assert c.start <= rec["seen_running"] + 1.0
            else:  # seen pending last, then started in the moment before the hub ended it
                assert c.start >= rec.get("checked_at", float("inf")) - 1.0, (
                    f"session {c.workload} charged, never seen running", c.start, rec)
            assert rec["end_called"] - 1.0 <= c.end <= rec["end_answered"] + 1.0, (
                c.workload, c.end, rec)
            for sl in row.placement or []:
                held.setdefault((sl["node"], sl["gpu"]), []).append((c.start, c.end, c.workload))
    # every launched attempt is in the ledger (nothing ran uncharged)
    launched = {(w.name, int(a.name)) for w in jobs_root.iterdir() if w.is_dir()
                for a in w.iterdir() if a.name.isdigit() and (a / "pid").exists()}
    assert launched <= seen_attempts, f"launched but never charged: {launched - seen_attempts}"
    for gpu, spans in held.items():
        spans.sort()
        for (_s1, e1, w1), (s2, _e2, w2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1 - 0.001, f"GPU {gpu} held by {w1} and {w2} at once"


def test_sqlite_ledger_refuses_a_second_replica(tmp_path):
    """SQLite stays single-process: a second service on the same ledger exits, saying so."""
    import subprocess
    import sys

    from tests.fixtures.hub import BUDGETS
    from tests.fixtures.ports import free_port
    from tests.fixtures.replicas import INVENTORY

    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "tokens.json").write_text("{}")
    os.chmod(tmp_path / "tokens.json", 0o600)
    argv = [sys.executable, "-m", "jupyter_gpubudget.service",
            f"--budgets={tmp_path / 'budgets.yaml'}", f"--inventory={tmp_path / 'inventory.yaml'}",
            "--GpuBudgetService.inventory_source=declared",
            f"--db=sqlite:///{tmp_path / 'ledger.sqlite'}", f"--jobs-dir={tmp_path / 'jobs'}",
            f"--GpuBudgetService.tokens_file={tmp_path / 'tokens.json'}", "--ip=127.0.0.1"]
    port = free_port()
    first = subprocess.Popen([*argv, f"--port={port}"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # up and answering: it holds the ledger's lock
        wait_http(f"http://127.0.0.1:{port}/api/v1/healthz", proc=first)
        second = subprocess.run([*argv, f"--port={free_port()}"], cwd=tmp_path,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stderr[-2000:]
        assert "another gpubudget service process uses this SQLite ledger" in second.stderr
        assert "PostgreSQL" in second.stderr
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(15)


def test_hub_and_lab_clients_try_the_next_replica(cluster):
    """The spawner's and the lab's clients take a list of replicas: a dead one and a
    standby (503 not_leader) are passed over, the leader answers."""
    import asyncio

    from jupyter_gpubudget.hub.client import ServiceClient as HubClient
    from jupyter_gpubudget.serverext.config import GpuBudgetLab
    from jupyter_gpubudget.serverext.service import ServiceClient as LabClient
    from tests.fixtures.ports import free_port
    from tests.fixtures.replicas import TOKENS

    leader = cluster.wait_leader()
    standby = next(r for r in cluster.replicas if r is not leader)
    dead = f"http://127.0.0.1:{free_port()}/services/gpubudget"
    urls = ",".join([dead, standby.base, leader.base])

    async def go() -> tuple[dict, int, dict]:
        hub = HubClient(",".join(u + "/api/v1" for u in urls.split(",")), TOKENS["root"][0], 10)
        made = await hub.request("POST", "/sessions", {"user": "dave", "project": "astro",
                                                       "gpus": 1})
        lab = LabClient(GpuBudgetLab(service_url=urls, api_token=TOKENS["dave"][0]))
        a = await lab.call("DELETE", f"sessions/{made['id']}")
        return made, a.status, a.body

    made, status, body = asyncio.run(go())
    assert made["state"] in ("pending", "running")
    assert status == 200, body


def test_partitioned_leader_stops_at_its_lease_end_and_its_late_write_is_fenced(
        postgres_server):  # noqa: F811
    """A partition that drops packets: the leader's database calls hang (no error). It stops
    leading at its lease end by its own clock while its write still hangs; the other replica
    takes the lease; after the heal the held write reaches the database and is refused by
    the fencing token — nothing of it is written."""
    import threading

    from jupyter_gpubudget.ledger.db import upgrade
    from jupyter_gpubudget.service.leader import Lease, NotLeader
    from tests.fixtures.replicas import Proxy

    url = postgres_server.new_database()
    upgrade(url)
    proxy = Proxy(postgres_server.port)
    via = url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    assert via != url
    engine_a, lease_engine_a, engine_b = connect(via), connect(via, pool_size=1), connect(url)
    a = Lease(lease_engine_a, url="a", ttl=3.0, renew_interval=0.5, holder="a")
    b = Lease(engine_b, url="b", ttl=3.0, renew_interval=0.5, holder="b")
    ledger_a = Ledger(engine_a)
    ledger_a.fence = a.check
    try:
        assert a.tick() is not None and b.tick() is None
        ledger_a.set_state("before", "1")  # a writes while it leads
        a.start()
        b.start()
        proxy.cut("drop")
        lease_end = a.valid_until
        outcome: list[object] = []

        def late_write() -> None:
            try:
                ledger_a.set_state("late", "1")
                outcome.append("written")
            except Exception as e:  # noqa: BLE001 - what the heal brings is the point
                outcome.append(e)

        writer = threading.Thread(target=late_write, daemon=True)
        writer.start()
        while time.monotonic() < lease_end + 0.1:
            time.sleep(0.05)
        assert not a.is_leader, "the partitioned leader still acts after its lease end"
        deadline = time.monotonic() + 60
        while not b.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.is_leader, "the other replica never took the lease"
        assert writer.is_alive(), f"the write did not hang: the partition was no partition " \
                                  f"({outcome})"
        proxy.heal()
        writer.join(60)
        assert not writer.is_alive(), "the late write still hangs after the heal"
        assert outcome and isinstance(outcome[0], NotLeader), outcome
        ledger_b = Ledger(engine_b)
        assert ledger_b.get_state("before") == "1"
        assert ledger_b.get_state("late") is None, "the old leader's late write got through"
        assert b.is_leader and b.tick() is not None  # the lease stayed where it went
    finally:
        proxy.heal()
        a.stop(release=False)
        b.stop(release=False)
        proxy.close()
        for e in (engine_a, lease_engine_a, engine_b):
            e.dispose()
