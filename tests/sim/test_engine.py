"""The simulator drives the real core: a hand-computed scenario, determinism, failures."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR
from jupyter_gpubudget.sim import metrics
from jupyter_gpubudget.sim.engine import BudgetChange, NodeFailure, SimConfig, simulate
from jupyter_gpubudget.sim.synthetic import SyntheticSpec, generate, synthetic_inventory
from jupyter_gpubudget.sim.traces import parse_native

BUDGETS = load_budgets("accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n", "b.yaml")
ONE_NODE = Inventory((make_node("n0", "H100-80GB", 2),))
# the hand-computed scenarios price a preemption by the work it throws away alone
BARE = load_budgets("policy: {preemption_toll: 0, preemption_margin: 0}\n"
                    "accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n", "bare.yaml").policy


def scenario(kind: str = "batch", resumable: str = "true", **cfg: object):  # type: ignore[no-untyped-def]
    """j1 (project a) takes both GPUs at t=0 for 1 h, protected for 30 min.
    j2 (project b, 1 GPU, 30 min) arrives at t=600 and must wait.
    Cycles every 600 s: at 1800 j1's protection ends, b stands below a (a has used
    1 GPU-h, b nothing), so j1 is preempted and j2 starts (wait 1200 s). j1 is requeued; it
    needs both GPUs, so it restarts when j2 ends at 3600."""
    trace = parse_native(
        "id,submit,duration,gpus,project,user,kind,min_runtime,resumable\n"
        f"j1,0,3600,2,a,ann,{kind},1800,{resumable}\n"
        "j2,600,1800,1,b,bob,batch,0,true\n", "scenario.csv")
    config = SimConfig(cycle_interval=600, fast_meter=True, **cfg)  # type: ignore[arg-type]
    return simulate(trace, BUDGETS.accounts, ONE_NODE, BARE, config)


def test_hand_computed_resumable_preemption() -> None:
    """Policy defaults: checkpoints every 30 min, 120 s reload. j1 is preempted at 1800 s,
    right at its first checkpoint: it keeps 1800 s of work and loses only the reload
    (2 GPUs × 120 s), which the core priced at 0.067 GPU-h against j2's 1 GPU-hour run."""
    res = scenario()
    j1, j2 = res.records["j1"], res.records["j2"]
    assert (j1.wait, j2.wait) == (0, 1200)
    assert j1.preemptions == 1 and j2.preemptions == 0
    assert j1.end == 3600 + 120 + 1800  # reload, then the remaining half hour after j2 ends
    assert j2.end == 1800 + 1800
    assert j1.lost_gpu_hours == pytest.approx(2 * 120 / HOUR)
    # charges: a = 2 GPUs × (1800 s + 1920 s); b = 1 GPU × 1800 s
    assert res.project_hours == pytest.approx({"a": 2 * 3720 / HOUR, "b": 0.5})
    assert res.decisions["start"] == 3 and res.decisions["preempt"] == 1
    m = metrics.compute(res)
    assert m["kinds"]["batch"]["wait_p50_s"] == 600
    assert m["kinds"]["batch"]["preemptions"] == 1
    assert m["accounts"]["a"]["delivered_gpu_hours"] == pytest.approx(2 * 3720 / HOUR)
    assert m["utilisation"] == pytest.approx((2 * 3720 / HOUR + 0.5) / (2 * 5520 / HOUR))
    # without a reload and with continuous checkpoints nothing is lost
    res = scenario(checkpoint_interval=0.0, restart_overhead=0.0)
    assert res.records["j1"].lost_gpu_hours == 0.0 and res.records["j1"].end == 3600 + 1800


def test_non_resumable_half_way_is_not_preempted() -> None:
    """Half-way through, preempting non-resumable j1 would throw away 2 GPUs × 30 min =
    1 GPU-h to start j2 (1 GPU) at most 30 min before j1 is predicted to end (0.5 GPU-h):
    it does not pay, so j2 waits for j1."""
    res = scenario(resumable="false")
    j1, j2 = res.records["j1"], res.records["j2"]
    assert j1.preemptions == 0 and j1.lost_gpu_hours == 0.0
    assert j2.first_start == 3600 and j2.wait == 3000


def long_non_resumable(**cfg: object):  # type: ignore[no-untyped-def]
    """j1 (a, 2 GPUs, non-resumable, 10 h, declared limit 10 h, protected 30 min) from t=0;
    j2 (b, 2 GPUs, 30 min of work, declared limit 1 h, no protection asked) at t=600. At
    1800 preempting j1 loses 2 × 1800 s = 1 GPU-h and starts j2's predicted hour on 2 GPUs
    9.5 h sooner (2 GPU-h; b has used nothing, a 1 GPU-h: gap 1): it pays."""
    trace = parse_native(
        "id,submit,duration,gpus,project,user,kind,min_runtime,resumable,time_limit\n"
        "j1,0,10h,2,a,ann,batch,1800,false,10h\n"
        "j2,600,1800,2,b,bob,batch,0,true,1h\n", "long.csv")
    config = SimConfig(cycle_interval=600, **cfg)  # type: ignore[arg-type]
    return simulate(trace, BUDGETS.accounts, ONE_NODE, BARE, config)


def test_hand_computed_non_resumable_loses_progress() -> None:
    res = long_non_resumable()
    j1 = res.records["j1"]
    assert j1.preemptions == 1
    assert j1.end == 3600 + 36000  # starts over when j2 ends
    assert j1.lost_gpu_hours == pytest.approx(1.0)  # 2 GPUs × 30 min thrown away
    assert res.project_hours["a"] == pytest.approx(2 * (1800 + 36000) / HOUR)


def test_non_resumable_drop() -> None:
    res = long_non_resumable(nonresumable="drop")
    j1 = res.records["j1"]
    assert j1.dropped and j1.end is None
    m = metrics.compute(res)
    assert m["kinds"]["batch"]["dropped"] == 1 and m["kinds"]["batch"]["completed"] == 1


def test_hand_computed_interactive_snapshot_and_restore() -> None:
    res = scenario(kind="interactive", snapshot_cost=60.0, restore_cost=120.0)
    j1 = res.records["j1"]
    assert j1.preemptions == 1 and j1.restarts_from_snapshot == 1
    # requeued after its 60 s snapshot; restarts when j2 ends; restore 120 s + 1800 s left
    assert j1.end == 3600 + 120 + 1800
    assert j1.lost_gpu_hours == pytest.approx(2 * (60 + 120) / HOUR)
    assert res.project_hours["a"] == pytest.approx(2 * (1800 + 1920) / HOUR)


def test_node_failure_requeues_resumable_work() -> None:
    trace = parse_native("id,submit,duration,gpus,project,min_runtime\n"
                         "j1,0,3600,1,a,1h\n", "f.csv")
    inv = Inventory((make_node("n0", "H100-80GB", 1), make_node("n1", "H100-80GB", 1)))
    cfg = SimConfig(failures=[NodeFailure(1000.0, "n0", 600.0)], checkpoint_interval=0.0,
                    restart_overhead=0.0)
    res = simulate(trace, BUDGETS.accounts, inv, BUDGETS.policy, cfg)
    j1 = res.records["j1"]
    assert j1.failures == 1 and j1.preemptions == 0
    assert j1.end == 3600  # checkpointed continuously: moves to n1 at once with 2600 s left
    m = metrics.compute(res)
    assert m["node_failure_stops"] == 1
    # policy defaults: no checkpoint yet at 1000 s (one every 1800 s): all 1000 s are lost,
    # and the restart on n1 reloads for 120 s before doing the whole hour again
    res = simulate(trace, BUDGETS.accounts, inv, BUDGETS.policy,
                   SimConfig(failures=[NodeFailure(1000.0, "n0", 600.0)]))
    j1 = res.records["j1"]
    assert j1.end == 1000 + 120 + 3600
    assert j1.lost_gpu_hours == pytest.approx((1000 + 120) / HOUR)


def test_unknown_failure_node_is_refused() -> None:
    trace = parse_native("submit,duration,gpus,project\n0,10,1,a\n", "t.csv")
    with pytest.raises(ValueError, match="unknown node"):
        simulate(trace, BUDGETS.accounts, ONE_NODE, BUDGETS.policy,
                 SimConfig(failures=[NodeFailure(5.0, "nope")]))


def test_budget_change_applies() -> None:
    trace = parse_native("submit,duration,gpus,project\n0,100,1,a\n200,100,1,b\n", "t.csv")
    new = load_budgets("accounts:\n  a: {grant: 10}\n  b: {grant: 300}\n", "new.yaml")
    res = simulate(trace, BUDGETS.accounts, ONE_NODE, BUDGETS.policy,
                   SimConfig(budget_changes=[BudgetChange(150.0, new.accounts)]))
    assert res.accounts is new.accounts
    m = metrics.compute(res)
    assert m["accounts"]["b"]["grant_share"] == pytest.approx(300 / 310)


def _synthetic_run(seed: int):  # type: ignore[no-untyped-def]
    spec = SyntheticSpec(workloads=300, days=2, gpus=32, seed=seed)
    trace = generate(spec, ["a", "b"], [1, 1])
    inv = synthetic_inventory(spec.gpus, spec.mig_node_share)
    res = simulate(trace, BUDGETS.accounts, inv, BUDGETS.policy,
                   SimConfig(failure_rate=0.5, seed=seed))
    return metrics.compute(res), res


def test_deterministic_for_a_seed() -> None:
    m1, r1 = _synthetic_run(3)
    m2, r2 = _synthetic_run(3)
    assert m1 == m2
    assert [(k, r.first_start, r.end, r.preemptions) for k, r in r1.records.items()] == \
        [(k, r.first_start, r.end, r.preemptions) for k, r in r2.records.items()]
    m3, _ = _synthetic_run(4)
    assert m3 != m1


def test_capacity_never_exceeded_and_all_work_accounted() -> None:
    m, res = _synthetic_run(1)
    assert all(s.used_milli <= s.total_milli for s in res.samples)
    for r in res.records.values():
        assert r.end is not None, r.job.id  # everything finishes eventually
        assert r.end >= r.job.submit + r.job.duration - 1e-6
    delivered = sum(res.project_hours.values())
    assert delivered == pytest.approx(m["delivered_gpu_hours"])


def test_exact_and_fast_meter_agree() -> None:
    spec = SyntheticSpec(workloads=250, days=2, gpus=24, seed=7, load=1.2)
    trace = generate(spec, ["a", "b"], [3, 1])
    inv = synthetic_inventory(spec.gpus, 0.0)
    runs = [metrics.compute(simulate(trace, BUDGETS.accounts, inv, BUDGETS.policy,
                                     SimConfig(fast_meter=fast))) for fast in (False, True)]
    assert runs[0]["kinds"] == runs[1]["kinds"]
    for name, a in runs[0]["accounts"].items():
        assert a["delivered_gpu_hours"] == pytest.approx(
            runs[1]["accounts"][name]["delivered_gpu_hours"])


def test_engine_uses_the_policys_fragmentation_aware_placement() -> None:
    from dataclasses import replace

    from jupyter_gpubudget.core import fragmentation
    from jupyter_gpubudget.sim.engine import Simulator

    trace = parse_native("submit,duration,slice,project\n0,100,mps:300,a\n", "t.csv")
    sim = Simulator(trace, BUDGETS.accounts, ONE_NODE, BUDGETS.policy)
    assert fragmentation.active(sim.sched.cluster) is not None
    if "placement" in type(BUDGETS.policy).__dataclass_fields__:
        packed = replace(BUDGETS.policy, placement="pack")  # type: ignore[call-arg]
        sim2 = Simulator(trace, BUDGETS.accounts, ONE_NODE, packed)
        assert fragmentation.active(sim2.sched.cluster) is None
    res = sim.run()
    assert res.records["job-1"].end == 100


def test_checkpoint_interval_loses_progress_since_the_last_checkpoint() -> None:
    # j1 runs 1800 s before it is preempted. With checkpoints every 1200 s it keeps 1200 s
    # and loses 600 s, plus the 120 s reload, on 2 GPUs (0.4 GPU-h, less than the 0.5 GPU-h
    # j2 gains by starting 30 min before j1's predicted end); with every 600 s it keeps
    # 1800 s. With every 1000 s it would lose 2 × 920 s = 0.51 GPU-h: not worth it.
    res = scenario(checkpoint_interval=1200.0)
    j1 = res.records["j1"]
    assert j1.lost_gpu_hours == pytest.approx(2 * (600 + 120) / HOUR)
    assert j1.end == 3600 + 120 + (3600 - 1200)
    assert scenario(checkpoint_interval=1000.0).records["j1"].preemptions == 0
    res = scenario(checkpoint_interval=600.0)
    assert res.records["j1"].lost_gpu_hours == pytest.approx(2 * 120 / HOUR)
    assert res.records["j1"].end == 3600 + 120 + 1800
    # a costly preemption does not happen: checkpoints every 2 h would lose j1's whole
    # 1800 s run (2 GPU × 0.53 h ≈ 1.07 GPU-h), more than j2's 1-GPU-hour run gains
    res = scenario(checkpoint_interval=7200.0)
    assert res.records["j1"].preemptions == 0 and res.records["j2"].wait == 3000


def test_horizon_stops_the_clock_and_charges_up_to_it() -> None:
    res = scenario(horizon=2500.0)
    assert res.end == 2500.0
    j1, j2 = res.records["j1"], res.records["j2"]
    assert j1.end is None and j2.end is None  # j2 runs 1800..3600: still running
    assert res.project_hours["b"] == pytest.approx((2500 - 1800) / HOUR)
    m = metrics.compute(res)
    assert m["kinds"]["batch"]["completed"] == 0


def test_unused_capacity_adds_up_and_names_its_causes() -> None:
    """Every sample's free capacity is split into the causes, and on average the causes
    add up to what utilisation leaves (within the sampling's error)."""
    from jupyter_gpubudget.sim.engine import UNUSED_CAUSES

    m, res = _synthetic_run(2)
    for smp in res.samples:
        assert set(smp.unused) == set(UNUSED_CAUSES)
        assert sum(smp.unused.values()) == smp.total_milli - smp.used_milli
    used = sum(s.used_milli / s.total_milli for s in res.samples) / len(res.samples)
    assert sum(m["unused"].values()) == pytest.approx(1 - used, abs=1e-9)
    assert m["unused"]["mig_no_demand"] >= 0 and m["unused"]["empty_queue"] > 0


def test_unused_by_cause_by_hand() -> None:
    """One node: GPU0 whole, GPU1 an MPS share of 300, GPU2 free, GPU3 in MIG mode, idle.
    A 2-GPU job waits (it fits nowhere). GPU1's 700 milli are a fragment no waiting request
    fits; GPU2 is free but too little for the wait (fragmentation too); GPU3 is MIG with no
    MIG demand."""
    from jupyter_gpubudget.core.model import Policy as P
    from jupyter_gpubudget.core.scheduler import Scheduler
    from jupyter_gpubudget.sim.engine import unused_by_cause

    inv = Inventory((make_node("n0", "H100-80GB", 4, mig=(3,)),))
    s = Scheduler(BUDGETS.accounts, inv, P(whole_gpu_on_mig=False))
    from jupyter_gpubudget.core.model import SliceRequest, Workload

    s.submit(Workload("w", "a", "u", SliceRequest.whole(1), 0.0), 0.0)
    s.submit(Workload("m", "a", "u", SliceRequest.mps(300), 0.0), 0.0)
    assert unused_by_cause(s, 0.0) == {"mig_no_demand": 0, "reserved": 0, "fragmentation": 0,
                                       "drained": 0, "empty_queue": 700 + 1000 + 1000,
                                       "awaiting_cycle": 0}
    s.submit(Workload("g", "a", "u", SliceRequest.whole(3), 0.0), 0.0)
    got = unused_by_cause(s, 0.0)
    assert got["mig_no_demand"] == 1000 and got["fragmentation"] == 700 + 1000
    s.set_healthy("n0", False)
    assert unused_by_cause(s, 0.0)["drained"] == 2700


def test_delivered_share_while_contended_by_hand() -> None:
    """Scenario: j1 (a, 2 GPUs) runs alone 0-600 (nothing waits), then j2 (b) waits
    600-1800 while j1 runs: a gets 2 GPUs × 1200 s under contention; after j1's
    preemption at 1800, j1 waits while j2 runs 1800-3600: b gets 1 GPU × 1800 s."""
    res = scenario()
    assert res.contended_hours["a"] == pytest.approx(2 * 1200 / HOUR)
    assert res.contended_hours["b"] == pytest.approx(1800 / HOUR)
    m = metrics.compute(res)
    a = m["accounts"]["a"]
    assert a["contended_share"] == pytest.approx((2400 / 3600) / (2400 / 3600 + 0.5))
    assert a["demand_share"] == pytest.approx(2.0 / 2.5)  # 2 GPU-h of 2.5 asked
    assert m["preemptions_per_workload"] == 0.5
    assert m["lost_pct_of_delivered"] == pytest.approx(
        100 * (2 * 120 / HOUR) / m["delivered_gpu_hours"])


def test_work_after_the_horizon_is_left_out() -> None:
    trace = parse_native("submit,duration,gpus,project\n0,100,1,a\n5000,100,1,b\n", "h.csv")
    res = simulate(trace, BUDGETS.accounts, ONE_NODE, BUDGETS.policy, SimConfig(horizon=1000))
    m = metrics.compute(res)
    assert (m["workloads"], m["arrived"]) == (2, 1)
    assert m["kinds"]["batch"]["count"] == 1 and m["kinds"]["batch"]["never_started"] == 0
