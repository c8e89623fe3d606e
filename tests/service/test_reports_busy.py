"""Busy GPU time measured while jobs run: the service's real scheduling loop with the local
backend starts real jobs of two users in two projects; the busy sampler reads the NVML fake
(this machine has no GPU: the fake answers device utilisation, MIG GPM samples and
per-process utilisation as NVML does, at fractions the test sets) on a clock the test drives,
and the usage report's busy GPU-hours match the samples per user and per project. Without
NVML the report says unknown."""

from __future__ import annotations

import os
import time
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.backends.local import LocalBackend as _LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.inventory.busy import BusySampler, Running, running_here, sample_into
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.reports import Scope, report
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

BUDGETS = """\
accounts:
  lab:
    grant: 100
    children:
      optics: {grant: 50, members: [ann]}
      vision: {grant: 50, members: [ben]}
"""
INVENTORY = """\
nodes:
  - {name: gpu-host, model: H100-80GB, gpus: 2}
"""


def LocalBackend(**kw):  # noqa: ANN003, ANN201, N802
    """As root, the users' jobs run as their own Unix accounts (never as root)."""
    if os.geteuid() == 0:
        ensure_accounts(["ann", "ben"])
        kw.setdefault("unix_user_template", TEMPLATE)
    return _LocalBackend(**kw)


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(BUDGETS), time.time())
    yield led
    led.dispose()


#: a charge runs from the launcher's own start record, up to this much after the test's clock
#: read at the cycle (the launch itself: seconds on a machine whose two cores run twenty
#: tasks, where 2 s was once too little; the busy figures' 2 % is what the test is about)
LAUNCH_S = 30.0


def run_two_jobs(ledger, tmp_path, sampler, util_of):  # noqa: ANN001, ANN201
    """Start one job of ann (optics) and one of ben (vision), sample them every 10 s of
    the test's clock for an hour, end them; return (start, end)."""
    budgets = load_budgets(BUDGETS)
    clock = [time.time()]
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend, clock=lambda: clock[0])
    ids = {u: ledger.submit(project=p, user=u, kind="batch", now=clock[0],
                            request={"kind": "gpu", "gpus": 1},
                            command=["/bin/sh", "-c", "sleep 120"]).id
           for u, p in (("ann", "optics"), ("ben", "vision"))}
    try:
        loop.cycle()
        rows = {u: ledger.get(w) for u, w in ids.items()}
        assert all(r.state == "running" for r in rows.values())
        if sampler._nvml is not None and sampler._nvml.gpus:
            for u, r in rows.items():
                sampler._nvml.gpus[r.placement[0]["gpu"]]["util"] = util_of[u]
        t0 = clock[0]
        for _ in range(360):
            clock[0] += 10.0
            sample_into(ledger, sampler, lambda: running_here(ledger, backend), clock[0])
        end = clock[0]
    finally:
        for w in ids.values():
            iv = ledger.open_interval(w)
            backend.stop(w, iv.seq if iv else 1)
            if ledger.get(w).state == "running":
                ledger.stop(w, now=clock[0], state="done", closed_by="exit")
    return t0, end


def figures(ledger, start, end):  # noqa: ANN001, ANN201
    with ledger.ro() as s:
        r = report(s, account="lab", scope=Scope(["optics", "vision"]), start=start - 60,
                   end=end + 60, tz=ZoneInfo("UTC"), by="user", now=end + 60,
                   grants={}, window=7 * 86400)
    return r, {p["project"]: p for p in r["projects"]}


def test_busy_hours_match_the_samples_per_user_and_project(ledger, tmp_path):
    nv = FakeNvml(hgx_h200(mig_gpus=())[:2])
    sampler = BusySampler(nv, node="gpu-host")
    t0, end = run_two_jobs(ledger, tmp_path, sampler, {"ann": 90, "ben": 10})
    r, p = figures(ledger, t0, end)
    for project, user, frac in (("optics", "ann", 0.9), ("vision", "ben", 0.1)):
        assert p[project]["charged_gpu_h"] == pytest.approx(1.0, abs=LAUNCH_S / 3600)
        assert p[project]["busy_gpu_h"] == pytest.approx(frac, rel=0.02)
        line = p[project]["users"][0]
        assert line["user"] == user and line["busy_gpu_h"] == pytest.approx(frac, rel=0.02)
        assert line["idle_gpu_h"] == pytest.approx(1 - frac, rel=0.02)
    assert r["totals"]["busy_gpu_h"] == pytest.approx(1.0, rel=0.02)


def test_without_nvml_busy_time_is_unknown(ledger, tmp_path):
    sampler = BusySampler(FakeNvml(None), node="gpu-host")  # nvmlInit: library not found
    t0, end = run_two_jobs(ledger, tmp_path, sampler, {})
    assert sampler.off and "NVIDIA" in sampler.off
    r, p = figures(ledger, t0, end)
    assert p["optics"]["charged_gpu_h"] == pytest.approx(1.0, abs=LAUNCH_S / 3600)
    assert p["optics"]["busy_gpu_h"] is None and p["optics"]["idle_gpu_h"] is None
    assert r["totals"]["busy_gpu_h"] is None


def test_mig_instances_through_gpm_and_mps_shares_through_their_processes():
    gpus = hgx_h200(mig_gpus=(1,))[:3]
    gpus[1]["mig"][0]["util"] = 75  # the 3g.71gb instance at slot 0
    gpus[2]["procs"] = {4242: 45, 777: 30}  # two MPS clients: ours uses 45 % of the SMs
    nv = FakeNvml(gpus)
    s = BusySampler(nv)
    mig = [{"node": "n", "gpu": 1, "mig_start": 0, "milli": 429, "profile": "3g.71gb"}]
    assert s.measure(mig) is None  # the first GPM sample: nothing to compare with yet
    assert s.measure(mig) == pytest.approx((0.75, "gpm"))
    mps = [{"node": "n", "gpu": 2, "milli": 500}]
    assert s.measure(mps, frozenset({4242})) == pytest.approx((0.9, "process"))
    assert s.measure(mps, None) is None  # whose processes: unknown
    gpus[1]["gpm"] = False  # a GPU without GPM: unknown, not 0
    s2 = BusySampler(nv)
    assert s2.measure(mig) is None and s2.measure(mig) is None
    # one slice that cannot be measured makes the whole workload's reading unknown
    both = [*mps, {"node": "n", "gpu": 0, "milli": 1000}]
    assert s.measure(both, frozenset({4242})) is None
    gpus[0]["util"] = 50
    assert s.measure(both, frozenset({4242})) == pytest.approx(
        ((500 * 0.9 + 1000 * 0.5) / 1500, "device+process"))
    # a tick turns readings into spans from the previous one (or the start)
    r = Running("w", [{"node": "n", "gpu": 0, "milli": 1000}], 100.0)
    assert s.tick([r], 130.0) == [("w", 100.0, 130.0, 0.5, "device")]
    assert s.tick([r], 160.0) == [("w", 130.0, 160.0, 0.5, "device")]
