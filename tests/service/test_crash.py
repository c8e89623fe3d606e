"""kill -9 the service at random points during charge/start/stop operations; restart; the
ledger's totals equal the expected totals exactly, and nothing is counted twice."""

from __future__ import annotations

import http.client as httpclient
import json
import random
import threading
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import ServiceProc, http
from tests.service.conftest import cleanup

N_EXTERNAL = 20  # x (start, checkpoint, stop) = 60 operations
N_LOCAL = 4  # batch jobs through the scheduler and the local backend


def call_until_applied(svc: ServiceProc, kills: list, method: str, path: str, token: str,
                       body: dict, key: str) -> tuple[int, dict]:
    """Retry one operation with the same idempotency key until the service answers it,
    restarting the service whenever it is found dead."""
    for _ in range(200):
        if not restart_if_dead(svc):
            continue
        try:
            status, out = http(method, svc.api + path, token, body,
                               headers={"Idempotency-Key": key}, timeout=10)
        except (OSError, httpclient.HTTPException):
            time.sleep(0.02)
            continue
        if status >= 500:
            log = svc.dir / "service.log"
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise AssertionError(f"{status} {out}\n--- service.log (tail) ---\n{tail}")
        return status, out
    raise AssertionError("operation never applied")


def restart_if_dead(svc: ServiceProc) -> bool:
    """Restart a dead service; False if it was killed again while starting (a kill can land
    during start-up and reconciliation too)."""
    if svc.proc.poll() is None:
        return True
    try:
        svc.start()
    except RuntimeError:
        return False
    return True


def killer(svc: ServiceProc, rng: random.Random, kills: list) -> None:
    def kill() -> None:
        if svc.proc is not None and svc.proc.poll() is None:
            svc.kill9()
            kills.append(time.time())
    threading.Timer(rng.uniform(0.0, 0.04), kill).start()


@pytest.fixture(params=["sqlite", "postgresql"])
def crash_service(request, hub, tokens, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    else:
        url = request.getfixturevalue("postgres_server").new_database()
    svc = ServiceProc(hub, tmp_path, url, cycle_interval=0.2)
    svc.start()
    yield svc
    cleanup(svc, tokens["root"])


def test_kill9_at_random_points_keeps_totals_exact(crash_service, tokens):
    svc = crash_service
    rng = random.Random(20261129)
    admin, bob = tokens["root"], tokens["bob"]
    kills: list[float] = []

    # the plan: per external workload start < checkpoint < stop at whole seconds
    plans = {}
    for i in range(N_EXTERNAL):
        start = 1_000_000 + rng.randrange(0, 5000)
        cp = start + rng.randrange(1, 3000)
        stop = cp + rng.randrange(0, 3000)
        project, user = rng.choice([("lattice", "bob"), ("astro", "dave"), ("genomics", "erin")])
        milli = rng.choice([1000, 2000, 500, 143])
        plans[f"ext{i}"] = (project, user, milli, start, cp, stop)
    queues = {w: [("start", p[3]), ("checkpoint", p[4]), ("stop", p[5])] for w, p in plans.items()}
    ops: list[tuple[str, str, float]] = []
    while any(queues.values()):
        w = rng.choice([w for w, q in queues.items() if q])
        ev, at = queues[w].pop(0)
        ops.append((w, ev, at))
    # interleave local batch job submissions (they start and stop through the scheduler)
    for j in range(N_LOCAL):
        ops.insert(rng.randrange(len(ops)), ("job", f"job{j}", 0.0))
    assert len(ops) >= 50

    for wid, ev, at in ops:
        if rng.random() < 0.25:
            killer(svc, rng, kills)
        if wid == "job":
            body = {"command": "sleep 0.3", "project": "lattice", "gpus": 1, "resumable": True,
                    "name": ev}
            status, out = call_until_applied(svc, kills, "POST", "/jobs", bob, body, key=ev)
            assert status == 201, out
            continue
        project, user, milli = plans[wid][:3]
        body = {"workload": wid, "event": ev, "at": at}
        if ev == "start":
            body.update(project=project, user=user, milli=milli, kind="batch")
        status, out = call_until_applied(svc, kills, "POST", "/usage/events", admin, body,
                                         key=f"{wid}:{ev}")
        assert status == 200, out
    assert len(kills) >= 8, "the test must actually kill the service"

    # let the local jobs finish (a killed service is restarted and reconciles)
    deadline = time.monotonic() + 90
    while True:
        time.sleep(0.2)
        if not restart_if_dead(svc):
            continue
        try:
            jobs = http("GET", svc.api + "/jobs", bob)[1]["jobs"]
        except (OSError, httpclient.HTTPException):
            continue  # a last kill landed
        if len(jobs) == N_LOCAL and all(j["state"] in ("done", "failed") for j in jobs):
            break
        assert time.monotonic() < deadline, jobs
    svc.stop()

    ledger = Ledger(connect(svc.db_url))
    try:
        expected: dict[str, float] = {}
        for project, _u, milli, start, _cp, stop in plans.values():
            expected[project] = expected.get(project, 0.0) + milli * (stop - start)
        ext = [c for c in ledger.charges() if c.workload.startswith("ext")]
        got: dict[str, float] = {}
        for c in ext:
            got[c.project] = got.get(c.project, 0.0) + c.milli * (c.end - c.start)
        assert got == expected  # exactly: nothing lost, nothing counted twice
        assert sorted(c.workload for c in ext) == sorted(plans)  # one interval each
        # local jobs: submitted once each despite retries, no overlapping intervals, all closed
        local = [w for w in ledger.workloads(user="bob") if w.backend == "local"]
        assert sorted(w.name for w in local) == [f"job{j}" for j in range(N_LOCAL)]
        for w in local:
            ivs = ledger.charges(workload=w.id)
            assert ivs and all(c.end is not None for c in ivs)
            assert [c.seq for c in ivs] == list(range(1, len(ivs) + 1))
            for a, b in zip(ivs, ivs[1:], strict=False):
                assert a.end <= b.start
            assert all(c.end >= c.start for c in ivs)
    finally:
        ledger.engine.dispose()


def test_job_ending_while_service_is_dead_is_charged_to_its_exit(hub, tokens, tmp_path):
    """The tail of an open interval is reconciled on restart from the job's exit record."""
    svc = ServiceProc(hub, tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                      cycle_interval=0.2)
    svc.start()
    try:
        status, job = http("POST", svc.api + "/jobs", tokens["bob"],
                           {"command": "sleep 1.5", "project": "lattice"})
        assert status == 201
        deadline = time.monotonic() + 30
        while http("GET", f"{svc.api}/workloads/{job['id']}", tokens["bob"])[1]["state"] != \
                "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        svc.kill9()
        exit_file = Path(tmp_path / "jobs" / job["id"] / "1" / "exit")
        deadline = time.monotonic() + 30
        while not exit_file.exists():  # the job ends while the service is dead
            assert time.monotonic() < deadline
            time.sleep(0.05)
        svc.start()  # reconciles
        row = http("GET", f"{svc.api}/workloads/{job['id']}", tokens["bob"])[1]
        assert row["state"] == "done" and row["exit_code"] == 0
    finally:
        cleanup(svc, tokens["root"])
    ledger = Ledger(connect(svc.db_url))
    try:
        (iv,) = ledger.charges(workload=job["id"])
        assert iv.end == json.loads(exit_file.read_text())["ended_at"]
        assert iv.closed_by == "exit"
    finally:
        ledger.engine.dispose()


def test_preemption_interrupted_by_a_crash_is_completed_on_restart(hub, tokens, tmp_path):
    svc = ServiceProc(hub, tmp_path, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                      cycle_interval=0.2)
    svc.start()
    bob = tokens["bob"]
    try:
        status, job = http("POST", svc.api + "/jobs", bob,
                           {"command": "sleep 120", "project": "lattice", "resumable": True})
        assert status == 201
        deadline = time.monotonic() + 30
        while not (tmp_path / "jobs" / job["id"] / "1" / "pid").exists():  # launched
            assert time.monotonic() < deadline
            time.sleep(0.05)
        svc.kill9()
        # the service died right after recording its intent to preempt, before stopping it
        ledger = Ledger(connect(svc.db_url))
        ledger.record_decision(now=time.time(), kind="preempting", workload=job["id"],
                               reason="for a backed workload")
        ledger.dispose()
        from jupyter_gpubudget.backends.local import LocalBackend

        jobs = LocalBackend(state_dir=str(tmp_path / "jobs"))
        assert jobs.status(job["id"], 1).alive  # the job outlived the service
        svc.start()
        row = http("GET", f"{svc.api}/workloads/{job['id']}", bob)[1]
        assert row["preemptions"] == 1 and row["state"] in ("pending", "running")
        assert not jobs.status(job["id"], 1).alive  # attempt 1 was stopped
        notices = http("GET", svc.api + "/notices", bob)[1]["notices"]
        assert [n["workload"] for n in notices] == [job["id"]] and notices[0]["requeued"]
    finally:
        cleanup(svc, tokens["root"])
