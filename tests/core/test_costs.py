"""Preemption costs, the pays-rule, run-time prediction, backfill's safety valve and the
other scheduling-quality rules — each on a case small enough to compute by hand."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest

from jupyter_gpubudget.core.backfill import (
    plain_p90,
    predict_runtime,
    predicted_end,
)
from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Placement,
    Policy,
    Preempt,
    Reserve,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Start,
    Workload,
    feature_chain,
    feature_keys,
    gpu_fraction,
    request_milli,
    shape_label,
)
from jupyter_gpubudget.core.preemption import (
    last_checkpoint,
    lost_seconds,
    preemption_cost,
    preemption_gain,
    preemption_pays,
    standing_gap,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import inventory, job, tree

NOW = 100 * HOUR
POLICY = Policy()  # checkpoints every 1800 s, a 120 s reload


def running(wid: str, gpus: int = 1, started: float = 0.0, **kw: object) -> Workload:
    w = Workload(wid, "a", "u", SliceRequest.whole(gpus), 0.0, **kw)  # type: ignore[arg-type]
    w.started_at = started
    w.placement = Placement(tuple(SliceAlloc("n0", i) for i in range(gpus)))
    return w


# ---------------------------------------------------------------- one definition of "fraction"


def test_gpu_fraction_of_every_kind_of_request() -> None:
    assert request_milli(SliceRequest.whole(3)) == 3000
    assert request_milli(SliceRequest.mps(250)) == 250
    assert request_milli(SliceRequest.mig("3g.40gb")) == 429  # 3 of 7 compute slices
    assert request_milli(SliceRequest.mig("1g.10gb")) == 143
    assert request_milli(SliceRequest.mig("7g.80gb")) == 1000
    assert request_milli(SliceRequest.cpu_only()) == 0
    assert gpu_fraction(SliceRequest.mig("2g.20gb")) == pytest.approx(0.286)


# ---------------------------------------------------------------- what a preemption throws away


def test_lost_seconds_by_hand() -> None:
    batch = running("b", resumable=True, kind="batch")
    # 2000 s in: last checkpoint at 1800 s, so 200 s lost, plus the 120 s reload
    assert lost_seconds(batch, 2000.0, POLICY) == 200.0 + 120.0
    assert lost_seconds(batch, 1800.0, POLICY) == 120.0  # right at a checkpoint
    # declared: checkpoints every 600 s, a 30 s reload
    declared = replace(batch, checkpoint_interval=600.0, restart_overhead=30.0)
    assert lost_seconds(declared, 2000.0, POLICY) == 200.0 + 30.0
    continuous = replace(batch, checkpoint_interval=0.0)
    assert lost_seconds(continuous, 2000.0, POLICY) == 120.0
    # not resumable: the whole run
    assert lost_seconds(replace(batch, resumable=False), 2000.0, POLICY) == 2000.0
    # a session is snapshotted (checkpoint interval 0 by default): snapshot + restore
    session = replace(batch, kind="interactive", resumable=False, snapshot_cost=60.0,
                      restart_overhead=90.0)
    assert lost_seconds(session, 2000.0, POLICY) == 60.0 + 90.0


def test_backfilled_job_saves_its_progress_when_its_gpus_are_due() -> None:
    """Backfilled at 0 onto GPUs due at 1000 s: a resumable job checkpoints then too. Taken
    back at 1200 s it loses 200 s (+ reload), not the 1200 s since its start."""
    w = replace(running("b", resumable=True), backfill_until=1000.0)
    assert last_checkpoint(w, 900.0, POLICY) == 0.0
    assert last_checkpoint(w, 1200.0, POLICY) == 1000.0
    assert last_checkpoint(w, 2000.0, POLICY) == 1800.0  # a regular checkpoint since
    assert lost_seconds(w, 1200.0, POLICY) == 200.0 + 120.0
    assert last_checkpoint(replace(w, checkpoint_interval=0.0), 1200.0, POLICY) == 1200.0


def test_preemption_cost_in_gpu_hours() -> None:
    w = running("b", gpus=2, started=NOW - 2000.0, resumable=True)
    assert preemption_cost(w, NOW, POLICY) == pytest.approx(2 * 320.0 / HOUR)
    assert preemption_cost(replace(w, placement=None), NOW, POLICY) == 0.0


def test_standing_gap_gain_and_pays() -> None:
    assert standing_gap(0.5, 1.0) == 0.5
    assert standing_gap(0.2, 0.8) == pytest.approx(0.75)
    assert standing_gap(1.0, 0.5) == 0.0  # the victim does not stand above
    assert standing_gap(0.5, 0.5) == 0.0
    assert standing_gap(0.5, math.inf) == 1.0  # no grant at all
    assert preemption_gain(2.0, 0.25) == 0.5
    assert preemption_gain(2.0, 3.0) == 2.0 and preemption_gain(-1.0, 0.5) == 0.0
    assert preemption_pays(0.5, 0.5) and not preemption_pays(0.51, 0.5)


def _contended(b_started: float, a_min_runtime: float = 0.0, policy: Policy = POLICY,
               b_resumable: bool = True) -> list:  # type: ignore[type-arg]
    """One GPU. b (used 90 of 100 GPU-h) runs b1 since ``b_started``, predicted 10 h (its
    declared limit); a (used nothing) waits with a1 (declared limit 1 h). The cycle at NOW
    decides whether a1 preempts b1."""
    s = Scheduler(tree(), inventory(gpus=1), policy)
    s.meter.add(ChargeInterval("old", "b", "x", 1000, NOW - 90 * HOUR, NOW - 10 * HOUR))
    s.submit(job("b1", "b", resumable=b_resumable, limit=10 * HOUR), b_started)
    s.submit(job("a1", "a", at=1.0, min_runtime=a_min_runtime), NOW)
    return s.cycle(NOW)


def test_preemption_happens_only_when_it_pays() -> None:
    """a1 gains its 1-hour run on 1 GPU (gap: b stands at ~1.0 after its 10 h more, a at 0:
    gap 1) = 1 GPU-h. b1 started 20 min ago (no checkpoint yet): 1200 + 120 s = 0.367 GPU-h
    lost — pays. Not resumable and 5 h in: 5 GPU-h lost — does not."""
    ds = _contended(NOW - 1200.0)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["b1"]
    ds = _contended(NOW - 5 * HOUR, b_resumable=False)
    assert not [d for d in ds if isinstance(d, Preempt)]


def test_toll_counts_on_top_of_the_lost_work() -> None:
    # 0.367 GPU-h lost + a 0.7 GPU-h toll > 1 GPU-h gained: no preemption
    ds = _contended(NOW - 1200.0, policy=replace(POLICY, preemption_toll=0.7))
    assert not [d for d in ds if isinstance(d, Preempt)]
    ds = _contended(NOW - 1200.0, policy=replace(POLICY, preemption_toll=0.6))
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["b1"]


def test_gain_is_capped_by_when_capacity_frees_anyway() -> None:
    """b1 (predicted 10 h, started 9 h 50 min ago) ends in 10 min: preempting it buys a1
    at most 10 min of its hour (0.167 GPU-h), less than the 120 s reload + 10 min since its
    last checkpoint (0.2 GPU-h): a1 waits."""
    s = Scheduler(tree(), inventory(gpus=1))
    s.submit(job("b1", "b", resumable=True, limit=10 * HOUR), NOW - 9 * HOUR - 50 * 60)
    s.meter.add(ChargeInterval("old", "b", "x", 1000, NOW - 90 * HOUR, NOW - 10 * HOUR))
    s.submit(job("a1", "a", at=1.0), NOW)
    assert s.next_free(SliceRequest.whole(1), NOW) == pytest.approx(600.0)
    assert not [d for d in s.cycle(NOW) if isinstance(d, Preempt)]


def test_next_free_counts_gpus_as_running_work_ends() -> None:
    s = Scheduler(tree(), inventory(gpus=4))
    for wid, gpus, limit in (("r1", 1, HOUR), ("r2", 2, 2 * HOUR), ("r3", 1, 3 * HOUR)):
        s.submit(job(wid, "a", gpus=gpus, limit=limit), NOW)
    assert s.next_free(SliceRequest.whole(1), NOW) == HOUR
    assert s.next_free(SliceRequest.whole(2), NOW) == 2 * HOUR  # 1 at 1 h, 3 at 2 h
    assert s.next_free(SliceRequest.whole(3), NOW) == 2 * HOUR
    assert s.next_free(SliceRequest.whole(4), NOW) == 3 * HOUR
    assert s.next_free(SliceRequest.whole(5), NOW) == math.inf
    # past its predicted end, r1 counts as ending half again as long as it has run
    assert s.next_free(SliceRequest.whole(1), NOW + 2 * HOUR) == pytest.approx(HOUR)


def test_margin_makes_close_standings_not_take_turns() -> None:
    """a stands at 0.5, b at 0.55: without margin the gap is (0.55 − 0.5) / 0.55 = 9 %, a1's
    10-hour protected run gains 0.9 GPU-h and preempting b1 (just started) pays; with a 25 %
    margin b would have to stand above 0.625: nothing happens."""
    for margin, expect in ((0.0, ["b1"]), (0.25, [])):
        s = Scheduler(tree(), inventory(gpus=1), replace(POLICY, preemption_margin=margin))
        s.meter.add(ChargeInterval("ca", "a", "x", 1000, NOW - 50 * HOUR, NOW - 0.0))
        s.meter.add(ChargeInterval("cb", "b", "x", 1000, NOW - 55 * HOUR, NOW - 0.0))
        s.submit(job("b1", "b", resumable=True, limit=10 * HOUR), NOW)
        s.submit(job("a1", "a", at=1.0, min_runtime=0.0, limit=10 * HOUR), NOW)
        got = [d.workload for d in s.cycle(NOW + 60.0) if isinstance(d, Preempt)]
        assert got == expect


# ---------------------------------------------------------------- prediction


def test_feature_keys_and_shape_labels() -> None:
    assert shape_label(SliceRequest.whole(4)) == "gpu:4"
    assert shape_label(SliceRequest.mps(500)) == "mps:500"
    assert shape_label(SliceRequest.mig("1g.10gb")) == "mig:1g.10gb"
    assert shape_label(SliceRequest.cpu_only()) == "cpu"
    keys = feature_keys("u", "p", "batch", "gpu:1", "train.py")
    assert keys[0] == ("k", "batch")
    assert ("usc", "u", "p", "batch", "gpu:1", "train.py") in keys
    assert ("uc", "u", "p", "batch", "train.py") in keys  # also learnt without the slice
    assert len(keys) == 8 and len(feature_keys("u", "p", "batch")) == 3
    assert feature_chain("u", "p", "batch", "gpu:1") == [
        ("k", "batch"), ("ks", "batch", "gpu:1"), ("ps", "p", "batch", "gpu:1"),
        ("us", "u", "p", "batch", "gpu:1")]


def test_prediction_blends_broad_and_specific_runs_by_hand() -> None:
    h = RuntimeHistory()
    for x in (100, 200, 300, 400, 500):
        h.add("u", "p", "batch", float(x), shape="gpu:1")
    w = Workload("w", "p", "u", SliceRequest.whole(1), 0.0)
    # every key has the same five runs: the 0.6-quantile is the 4th (index int(0.6·5) = 3)
    assert predict_runtime(w, h, POLICY, 0.6) == pytest.approx(400.0)
    for x in (1000, 2000, 3000, 4000, 5000):
        h.add("v", "p", "batch", float(x), shape="gpu:1")
    # kind, slice, project: ten runs each, index 6 → 2000; the user's: 400. Log estimate:
    # log 2000 three times over, then the user (5 runs): (5·log 400 + 4·log 2000) / 9
    est = (5 * math.log(400) + 4 * math.log(2000)) / 9
    assert predict_runtime(w, h, POLICY, 0.6) == pytest.approx(math.exp(est))
    # history learnt without slices (as an older ledger has it): the plain chain
    plain = RuntimeHistory()
    for x in (100, 200, 300, 400, 500):
        plain.add("u", "p", "batch", float(x))
    assert predict_runtime(w, plain, POLICY, 0.6) == pytest.approx(400.0)
    # never beyond the declared limit; nothing learnt: the limit, else the policy default
    assert predict_runtime(replace(w, time_limit=300.0), h, POLICY, 0.6) == 300.0
    fresh = RuntimeHistory()
    assert predict_runtime(replace(w, time_limit=7200.0), fresh, POLICY) == 7200.0
    assert predict_runtime(w, fresh, POLICY) == POLICY.default_runtime


def test_plain_p90_baseline_by_hand() -> None:
    h = RuntimeHistory()
    for x in range(1, 11):
        h.add("u", "p", "batch", 100.0 * x)
    w = Workload("w", "p", "u", SliceRequest.whole(1), 0.0)
    assert plain_p90(w, h, POLICY) == 1000.0  # index int(0.9·10) = 9
    assert plain_p90(replace(w, user="new"), h, POLICY) == 1000.0  # the project's runs
    assert plain_p90(replace(w, project="q", time_limit=50.0), h, POLICY) == 50.0


def test_predicted_end_of_running_work() -> None:
    w = Workload("w", "p", "u", SliceRequest.whole(1), 0.0, started_at=0.0)
    assert predicted_end(w, 50.0, 100.0) == 100.0
    assert predicted_end(w, 200.0, 100.0) == 300.0  # overran: half again as long as so far
    assert predicted_end(w, 70.0, 60.0) == 130.0  # at least a minute more
    assert predicted_end(replace(w, time_limit=250.0), 200.0, 100.0) == 250.0
    assert predicted_end(replace(w, time_limit=150.0), 200.0, 100.0) == 300.0


def test_scheduler_learns_runs_under_their_features() -> None:
    s = Scheduler(tree(), inventory(gpus=1))
    for k in range(3):
        w = replace(job(f"w{k}", "a", kind="debug", limit=None), command="pytest")
        s.submit(w, NOW + 1000 * k)
        s.finish(w.id, NOW + 1000 * k + 600)
    assert len(s.history.runs[("uc", "u", "a", "debug", "pytest")]) == 3
    w2 = replace(job("next", "a", kind="debug", limit=None), command="pytest")
    assert s.predict(w2) == pytest.approx(600.0)
    # two runs are not enough for a key to count: the policy default
    s2 = Scheduler(tree(), inventory(gpus=1))
    for k in range(2):
        s2.submit(job(f"w{k}", "a", kind="debug", limit=None), NOW)
        s2.finish(f"w{k}", NOW + 600)
    assert s2.predict(job("x", "a", kind="debug", limit=None)) == Policy().default_runtime


def test_declared_limit_wins_over_other_projects_runs() -> None:
    """Only other projects' runs of the kind are known (b's three 60 s jobs): a job of a
    that declares 2 h is predicted at its declared 2 h; one that declares nothing at 60 s."""
    h = RuntimeHistory()
    for _ in range(3):
        h.add("v", "b", "batch", 60.0, shape="gpu:1")
    w = Workload("w", "a", "u", SliceRequest.whole(1), 0.0, time_limit=2 * HOUR)
    assert predict_runtime(w, h, POLICY) == 2 * HOUR
    assert predict_runtime(replace(w, time_limit=None), h, POLICY) == pytest.approx(60.0)
    for _ in range(3):  # once a's own runs are known, they count
        h.add("u", "a", "batch", 600.0, shape="gpu:1")
    assert predict_runtime(w, h, POLICY) < 600.0 + 1


# ---------------------------------------------------------------- backfill's safety valve


def test_overdue_backfill_is_preempted_at_the_reservation_time() -> None:
    """4 GPUs. r1 (2 GPUs, predicted 2 h) runs; the gang (4 GPUs) gets a reservation at
    NOW + 2 h; "short" (predicted 1 h) backfills onto a reserved GPU. It is still running
    when r1 ends at NOW + 2 h: unprotected, it is preempted there and the gang starts."""
    s = Scheduler(tree(), inventory(gpus=4), Policy(max_reservations=1, finish_drain_ratio=0))
    s.submit(job("r1", "b", gpus=2, limit=2 * HOUR), NOW)
    s.submit(job("gang", "a", gpus=4, at=1.0, limit=8 * HOUR), NOW)
    ds = s.cycle(NOW)
    (res,) = [d for d in ds if isinstance(d, Reserve)]
    assert res.at == NOW + 2 * HOUR
    (st,) = s.submit(job("short", "b", limit=HOUR, at=2.0), NOW)
    assert isinstance(st, Start) and st.backfill_until == NOW + 2 * HOUR
    assert s.running["short"].backfill_until == NOW + 2 * HOUR
    s.finish("r1", NOW + 2 * HOUR)
    ds = s.cycle(NOW + 2 * HOUR)
    pre = [d for d in ds if isinstance(d, Preempt)]
    assert [d.workload for d in pre] == ["short"] and pre[0].reason.startswith("backfilled")
    assert [d.workload for d in ds if isinstance(d, Start)] == ["gang"]


def test_protected_backfill_is_not_preempted() -> None:
    s = Scheduler(tree(), inventory(gpus=4), Policy(max_reservations=1, finish_drain_ratio=0))
    s.submit(job("r1", "b", gpus=2, limit=2 * HOUR), NOW)
    s.submit(job("gang", "a", gpus=4, at=1.0, limit=8 * HOUR), NOW)
    s.cycle(NOW)
    s.submit(job("short", "b", limit=HOUR, at=2.0, min_runtime=3 * HOUR), NOW)
    s.finish("r1", NOW + 2 * HOUR)
    ds = s.cycle(NOW + 2 * HOUR)
    assert not [d for d in ds if isinstance(d, Preempt)]
    assert "gang" in s.pending


def _leasing(lease: float, **long_kw: object) -> tuple[Scheduler, list]:
    """4 GPUs. r1 (2 GPUs, 2 h, protected throughout) runs; the gang (4 GPUs) is reserved
    from NOW + 2 h; then "long" (b, 1 GPU, 8 h) arrives, too long to end before the gang
    starts."""
    s = Scheduler(tree(), inventory(gpus=4), Policy(max_reservations=1, backfill_lease=lease))
    s.submit(job("r1", "b", gpus=2, limit=2 * HOUR, min_runtime=2 * HOUR), NOW)
    s.submit(job("gang", "a", gpus=4, at=1.0, limit=8 * HOUR), NOW)
    assert [d.at for d in s.cycle(NOW) if isinstance(d, Reserve)] == [NOW + 2 * HOUR]
    kw: dict[str, object] = {"resumable": True, **long_kw}
    return s, s.submit(job("long", "b", limit=8 * HOUR, at=2.0, **kw), NOW)  # type: ignore[arg-type]


def test_a_lease_lends_reserved_gpus_to_resumable_work_until_they_are_due() -> None:
    """With backfill_lease 1 h, "long" borrows a reserved GPU although it will run past
    NOW + 2 h: it is told the GPUs are due then (backfill_until); the gang's reservation
    does not slip for it (it plans with the GPU given back when due); at NOW + 2 h it is
    preempted for the gang, having saved its work then: it loses only its restart."""
    s, ds = _leasing(HOUR)
    (st,) = ds
    assert isinstance(st, Start) and st.workload == "long"
    assert st.backfill_until == NOW + 2 * HOUR
    assert [d.at for d in s.cycle(NOW + HOUR) if isinstance(d, Reserve)] == [NOW + 2 * HOUR]
    s.finish("r1", NOW + 2 * HOUR)
    long = s.running["long"]
    assert preemption_cost(long, NOW + 2 * HOUR, s.policy) == pytest.approx(
        s.policy.restart_overhead_of(long) / HOUR)
    ds = s.cycle(NOW + 2 * HOUR)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["long"]
    assert [d.workload for d in ds if isinstance(d, Start)] == ["gang"]


@pytest.mark.parametrize("case", ["off", "not resumable", "no checkpoints", "lease too long",
                                  "protected past the gang", "debug"])
def test_no_lease_where_the_work_cannot_give_the_gpus_back_in_time(case: str) -> None:
    """No lease when leasing is off (0); for work that cannot save its progress when the GPUs
    are due (not resumable, or no checkpoints); when the GPUs are due sooner than the lease
    (3 h asked, due in 2 h); when the work's protection would outlast the due time
    (semantics 2: protected work is never preempted, so it may not borrow); and for work
    that is not batch. "long" waits, and the reservation still stands at NOW + 2 h."""
    lease = {"off": 0.0, "lease too long": 3 * HOUR}.get(case, HOUR)
    kw: dict[str, object] = {"not resumable": {"resumable": False},
                             "no checkpoints": {"checkpoint_interval": 0.0},
                             "protected past the gang": {"min_runtime": 3 * HOUR},
                             "debug": {"kind": "debug"}}.get(case, {})
    if "checkpoint_interval" in kw:
        s, _ = _leasing(lease)
        s.cancel("long", NOW)
        w = replace(job("long", "b", limit=8 * HOUR, at=2.0, resumable=True),
                    checkpoint_interval=0.0)
        ds = s.submit(w, NOW)
    else:
        s, ds = _leasing(lease, **kw)
    assert ds == [] and "long" in s.pending
    assert [d.at for d in s.cycle(NOW + 60.0) if isinstance(d, Reserve)] == [NOW + 2 * HOUR]
    assert "long" in s.pending


def test_a_lease_is_at_least_the_protection() -> None:
    """Protected for 90 min, with a 1 h lease: the GPUs are due at NOW + 2 h, after its
    protection ends, so it may borrow them; it is never preempted before NOW + 90 min."""
    s, ds = _leasing(HOUR, min_runtime=1.5 * HOUR)
    (st,) = ds
    assert isinstance(st, Start) and st.backfill_until == NOW + 2 * HOUR
    assert st.protected_until is None or st.protected_until <= st.backfill_until


def _overdue(after: float, *, b_min_runtime: float = 0.0, a_used: float = 0.0,
             b_used: float = 80.0) -> Scheduler:
    """4 GPUs. b (used 80 of 100 GPU-h) runs r1 on all 4 since NOW − 1 h: not resumable,
    predicted 2 h. The gang (a, 4 GPUs, 1 h) arrives at NOW: preempting r1 would lose 4 GPU-h
    for a 4-GPU-h run, so it does not pay, and the gang's first reservation plans it at
    NOW + 1 h. r1 then runs past its prediction and the reservation slips."""
    s = Scheduler(tree(), inventory(gpus=4),
                  Policy(max_reservations=1, gang_overdue_after=after))
    s.meter.add(ChargeInterval("old", "b", "x", 1000, NOW - 90 * HOUR,
                               NOW - 90 * HOUR + b_used * HOUR))
    if a_used:
        s.meter.add(ChargeInterval("olda", "a", "x", 1000, NOW - 90 * HOUR,
                                   NOW - 90 * HOUR + a_used * HOUR))
    s.submit(job("r1", "b", gpus=4, limit=2 * HOUR, min_runtime=b_min_runtime), NOW - HOUR)
    s.submit(job("gang", "a", gpus=4, at=1.0), NOW)
    ds = s.cycle(NOW)
    assert not [d for d in ds if isinstance(d, Preempt)]
    assert [d.at for d in ds if isinstance(d, Reserve)] == [NOW + HOUR]
    assert s.first_planned == {"gang": NOW + HOUR}
    return s


def test_an_overdue_gang_preempts_what_would_not_pay() -> None:
    """With gang_overdue_after 1 h, the gang is overdue from NOW + 2 h (its first planned
    start plus 1 h), however late its reservation has slipped by then: it takes r1, which
    loses 12 GPU-h (3 h on 4 GPUs), and starts."""
    s = _overdue(HOUR)
    ds = s.cycle(NOW + HOUR)  # r1 overran: the reservation slips, the first plan stays
    assert [d.at for d in ds if isinstance(d, Reserve)] == [NOW + 2 * HOUR]
    assert s.first_planned == {"gang": NOW + HOUR}
    assert not [d for d in s.cycle(NOW + 2 * HOUR - 1.0) if isinstance(d, Preempt)]
    ds = s.cycle(NOW + 2 * HOUR)
    (pre,) = [d for d in ds if isinstance(d, Preempt)]
    assert pre.workload == "r1"
    assert "gang gang is 1.0 h past the start first planned for it" in pre.reason
    assert "project b stands above a" in pre.reason and "(loses 12." in pre.reason
    assert [d.workload for d in ds if isinstance(d, Start)] == ["gang"]
    assert s.first_planned == {}  # forgotten once it starts


def test_overdue_counts_in_seconds() -> None:
    """One second is a valid limit: overdue one second after the first planned start."""
    s = _overdue(1.0)
    assert not [d for d in s.cycle(NOW + HOUR) if isinstance(d, Preempt)]
    assert [d.workload for d in s.cycle(NOW + HOUR + 1.0) if isinstance(d, Preempt)] == ["r1"]


@pytest.mark.parametrize("case", ["off", "protected", "a stands higher"])
def test_an_overdue_gang_still_respects_protection_and_standing(case: str) -> None:
    """Off (0), a victim still in its protected run (b used 40 GPU-h: r1 is backed, so its
    protection holds), or a victim whose project stands below the gang's: no preemption at
    NOW + 3 h, well past overdue; the gang keeps waiting."""
    protected = case == "protected"
    s = _overdue(0.0 if case == "off" else HOUR, b_min_runtime=10 * HOUR if protected else 0.0,
                 b_used=40.0 if protected else 80.0,
                 a_used=95.0 if case == "a stands higher" else 0.0)
    s.cycle(NOW + HOUR)
    ds = s.cycle(NOW + 3 * HOUR)
    assert not [d for d in ds if isinstance(d, Preempt)]
    assert "gang" in s.pending and "r1" in s.running


def test_only_a_gang_that_had_a_reservation_can_be_overdue() -> None:
    """With no reservations at all, nothing is planned for the gang: never overdue."""
    s = Scheduler(tree(), inventory(gpus=4), Policy(max_reservations=0, gang_overdue_after=1.0))
    s.meter.add(ChargeInterval("old", "b", "x", 1000, NOW - 90 * HOUR, NOW - 10 * HOUR))
    s.submit(job("r1", "b", gpus=4, limit=2 * HOUR), NOW - HOUR)
    s.submit(job("gang", "a", gpus=4, at=1.0), NOW)
    for t in (NOW, NOW + HOUR, NOW + 5 * HOUR):
        assert not [d for d in s.cycle(t) if isinstance(d, (Preempt, Reserve))]
    assert s.first_planned == {}


def _draining(ratio: float, *, r1_limit: float = 10 * HOUR, r1_min_runtime: float = 0.0,
              a_used: float = 1.0, b_used: float = 60.0, budget: float = 0.007,
              recent: Sequence[tuple[float, float]] = ()) -> tuple[Scheduler, list]:
    """4 GPUs. b has used 60 of 100 GPU-h, a 1, so b stands above a; the fair-share rule
    never preempts here (a margin of 1000: b would have to stand 1001 times higher). r1 (b, 1 GPU, resumable, a 10 h limit) has
    run 30 min and just saved its work: preempting it loses its 120 s reload plus the
    0.25 GPU-h toll, 0.283 GPU-h. a's gang of 4 GPUs arrives at NOW: its reservation is at
    r1's end, NOW + 9.5 h, with 3 GPUs standing idle until then: 28.5 idle GPU-hours."""
    s = Scheduler(tree(), inventory(gpus=4),
                  Policy(max_reservations=1, finish_drain_ratio=ratio, preemption_margin=1000,
                         finish_drain_budget=budget))
    s.recent_losses.extend(recent)
    for wid, project, used in (("olda", "a", a_used), ("oldb", "b", b_used)):
        s.meter.add(ChargeInterval(wid, project, "x", 1000, NOW - 90 * HOUR,
                                   NOW - 90 * HOUR + used * HOUR))
    s.submit(job("r1", "b", limit=r1_limit, min_runtime=r1_min_runtime, resumable=True),
             NOW - HOUR / 2)
    assert "r1" in s.running
    s.submit(job("gang", "a", gpus=4, at=1.0, limit=8 * HOUR), NOW)
    return s, s.cycle(NOW)


def test_a_drain_is_finished_by_preempting_its_straggler_when_the_idle_time_is_worth_it() -> None:
    """With finish_drain_ratio 4: 28.5 idle GPU-h >= 4 x 0.283 GPU-h, so r1 is preempted
    (it loses only its reload: it had just saved) and the gang starts now instead of in
    9.5 h; with the ratio at 100 (28.3 GPU-h needed) too, just."""
    for ratio in (4.0, 100.0):
        s, ds = _draining(ratio)
        (pre,) = [d for d in ds if isinstance(d, Preempt)]
        assert pre.workload == "r1" and pre.for_workload == "gang"
        assert "the last of a drain for gang gang" in pre.reason
        assert "28.5 idle GPU-hours" in pre.reason and "(loses 0.28 GPU-h)" in pre.reason
        assert [d.workload for d in ds if isinstance(d, Start)] == ["gang"]
        assert not [d for d in ds if isinstance(d, Reserve)]
        assert "r1" not in s.running and s.reservations == {}


def test_a_drain_waits_while_the_days_preemptions_have_spent_the_loss_budget() -> None:
    """``finish_drain_budget`` 0.007 of 4 GPUs x 24 h: 0.672 GPU-h a day may be thrown away.
    r1's preemption throws away its 120 s reload, 0.0333 GPU-h (the toll is a price, not a
    loss). With 0.6 GPU-h thrown away in the last day the drain fits (0.633) and goes ahead,
    and its Preempt says what it threw away; with 0.65 (0.683 > 0.672) it waits, r1 runs
    on and the gang keeps its reservation; the same 0.65 thrown away more than a day ago
    does not count; with no budget (0) nothing stops it."""
    lost = 120 / HOUR
    s, ds = _draining(4.0, recent=[(NOW - 3 * HOUR, 0.6)])
    (pre,) = [d for d in ds if isinstance(d, Preempt)]
    assert pre.lost == pytest.approx(lost)
    assert list(s.recent_losses) == [(NOW - 3 * HOUR, 0.6), (NOW, pytest.approx(lost))]
    assert s.recent_loss(NOW) == pytest.approx(0.6 + lost)
    s, ds = _draining(4.0, recent=[(NOW - 3 * HOUR, 0.65)])
    assert not [d for d in ds if isinstance(d, (Preempt, Start))]
    assert "r1" in s.running and "gang" in s.pending and "gang" in s.reservations
    for recent, budget in (([(NOW - 25 * HOUR, 0.65)], 0.007), ([(NOW - HOUR, 50.0)], 0.0)):
        s, ds = _draining(4.0, recent=recent, budget=budget)
        assert [d.workload for d in ds if isinstance(d, Start)] == ["gang"]


def test_the_recent_losses_come_in_with_the_state() -> None:
    """The live service rebuilds the scheduler every cycle: the day's losses it read from its
    decision log are the budget's, oldest first, and those older than a day drop out."""
    st = ClusterState(tree(), inventory(gpus=4),
                      recent_losses=[(NOW - HOUR, 0.5), (NOW - 30 * HOUR, 9.0)])
    s = Scheduler.from_state(st)
    assert s.recent_loss(NOW) == pytest.approx(0.5)
    assert list(s.recent_losses) == [(NOW - HOUR, 0.5)]


@pytest.mark.parametrize("case", ["off", "not worth it", "protected", "reservation soon",
                                  "victim stands below"])
def test_no_drain_is_finished_where_it_must_not_be(case: str) -> None:
    """Off (0); a ratio the idle time does not reach (101 x 0.283 > 28.5); a straggler still
    in its protected run (semantics 2); a reservation less than FINISH_DRAIN_AFTER away (r1's
    limit 1.2 h: due at NOW + 0.7 h); a straggler of a project standing below the gang's (a
    has used 60 GPU-h, b 1). r1 runs on, and the gang stays reserved at r1's end."""
    ratio = {"off": 0.0, "not worth it": 101.0}.get(case, 4.0)
    limit = 1.2 * HOUR if case == "reservation soon" else 10 * HOUR
    s, ds = _draining(ratio, r1_limit=limit,
                      r1_min_runtime=10 * HOUR if case == "protected" else 0.0,
                      **({"a_used": 60.0, "b_used": 1.0} if case == "victim stands below"
                         else {}))
    assert not [d for d in ds if isinstance(d, (Preempt, Start))]
    assert [d.at for d in ds if isinstance(d, Reserve)] == [NOW - HOUR / 2 + limit]
    assert "r1" in s.running and "gang" in s.pending


# ---------------------------------------------------------------- MIG GPUs and the short lane


def test_one_gpu_takes_an_idle_mig_gpu_whole_when_allowed() -> None:
    inv = inventory(gpus=2, mig=(1,))
    for allowed, expect in ((True, "7g.80gb"), (False, None)):
        s = Scheduler(tree(), inv, Policy(whole_gpu_on_mig=allowed, mig_first=False))
        s.submit(job("w1", "a"), NOW)
        ds = s.submit(job("w2", "a", at=1.0), NOW)
        if expect is None:
            assert ds == []
            continue
        (d,) = ds
        (sl,) = d.placement.slices
        assert (sl.gpu, sl.kind, sl.profile, sl.milli) == (1, "mig", expect, 1000)
        # a MIG slice asked for now finds the GPU taken whole
        assert s.submit(job("m", "a", req=SliceRequest.mig("1g.10gb"), at=2.0), NOW) == []


def test_one_gpu_work_takes_the_mig_gpu_first_and_leaves_the_others_to_gangs() -> None:
    """``mig_first`` (the default): the first one-GPU job takes the idle MIG-mode GPU whole,
    the next a GPU outside MIG mode; a two-GPU gang then finds none for it. Without it the
    first job takes GPU 0 and the MIG-mode GPU is left for the second."""
    inv = inventory(gpus=3, mig=(2,))
    for first, gpus in ((True, [2, 0]), (False, [0, 1])):
        s = Scheduler(tree(), inv, Policy(mig_first=first))
        got = [s.submit(job(f"w{i}", "a", at=float(i)), NOW)[0].placement.slices[0]
               for i in range(2)]
        assert [sl.gpu for sl in got] == gpus
        assert [sl.kind for sl in got] == (["mig", "gpu"] if first else ["gpu", "gpu"])
        assert all(sl.milli == 1000 for sl in got)  # charged as a whole GPU either way
    s = Scheduler(tree(), inv, Policy(whole_gpu_on_mig=False))  # mig_first needs it
    assert s.submit(job("w0", "a"), NOW)[0].placement.slices[0].gpu == 0


def test_an_mps_share_with_no_room_takes_the_smallest_mig_instance_that_holds_it() -> None:
    """GPU 0 is held whole, GPU 1 is in MIG mode. A 250-milli, 20,000-MiB share finds no GPU
    with room: with ``mps_on_mig`` it takes a 2g.20gb instance (2/7 of a GPU, 20 GB: the
    smallest with its compute and memory) and is charged its own 250 milli; without it, it
    waits. A 500-milli share takes a 4g.40gb (3g has 3/7 < 1/2 of the compute)."""
    inv = inventory(gpus=2, mig=(1,))
    share = SliceRequest.mps(250, 20000)
    for allowed in (True, False):
        s = Scheduler(tree(), inv, Policy(mps_on_mig=allowed, whole_gpu_on_mig=False))
        s.submit(job("big", "a"), NOW)
        ds = s.submit(job("m", "a", req=share, at=1.0), NOW)
        if not allowed:
            assert ds == []
            continue
        (sl,) = ds[0].placement.slices
        assert (sl.gpu, sl.kind, sl.profile, sl.milli) == (1, "mig", "2g.20gb", 250)
        assert s.usage_hours(NOW + HOUR)["a"] == pytest.approx(1.25)  # 1 GPU + 250 milli
        (sl,) = s.submit(job("h", "a", req=SliceRequest.mps(500), at=2.0),
                         NOW)[0].placement.slices
        assert (sl.gpu, sl.profile, sl.milli) == (1, "4g.40gb", 500)
        # no instance of the GPU is big enough for a share of 80 GB: it waits
        assert s.submit(job("x", "a", req=SliceRequest.mps(100, 81920), at=3.0), NOW) == []
    # a share with no memory limit needs its part of the GPU's 80 GB: 10 % (8 GB) a 1g.10gb;
    # 13 % (10.4 GB) a 1g.20gb — 1g.10gb has the compute (1/7) but not the memory
    for milli, profile in ((100, "1g.10gb"), (130, "1g.20gb")):
        s = Scheduler(tree(), inv, Policy(whole_gpu_on_mig=False))
        s.submit(job("big", "a"), NOW)
        (sl,) = s.submit(job("m", "a", req=SliceRequest.mps(milli), at=1.0),
                         NOW)[0].placement.slices
        assert (sl.profile, sl.milli) == (profile, milli)


def test_short_lane_and_kind_order() -> None:
    """One GPU free. a stands low with batch work; b stands high with a debug run and a
    session. The short lane (debug predicted ≤ 30 min) goes first: b's debug run starts.
    Within b, its session goes before its batch job."""
    def sched(lane: float) -> Scheduler:
        s = Scheduler(tree(), inventory(gpus=1), Policy(short_lane=lane))
        s.meter.add(ChargeInterval("cb", "b", "x", 1000, NOW - 60 * HOUR, NOW - HOUR))
        return s

    pending = [job("a-batch", "a", at=1.0), job("b-debug", "b", kind="debug", at=5.0,
                                                limit=600.0),
               job("b-nb", "b", kind="interactive", at=4.0), job("b-batch", "b", at=3.0)]
    from jupyter_gpubudget.core.explain import queue_order
    from jupyter_gpubudget.core.scheduler import ClusterState, schedule

    for lane, first in ((1800.0, "b-debug"), (0.0, "a-batch")):
        s = sched(lane)
        state = ClusterState(s.accounts, s.inventory, s.policy, pending=pending,
                             charges=s.meter.charges())
        assert [d.workload for d in schedule(state, NOW) if isinstance(d, Start)] == [first]
        order = queue_order(state, NOW)
        assert order.index("b-nb") < order.index("b-batch")


def test_short_run_takes_a_gpu_that_just_saved_its_progress() -> None:
    """One GPU, held by b's resumable batch job. a's debug run (10 min, short lane) waits.
    One minute after b1's checkpoint taking it loses 60 + 120 s (0.05 GPU-h) + the 0.25
    toll = 0.3 ≤ 0.35: it goes, whatever the standings (a stands higher here). Ten minutes
    after: 0.2 + 0.25 > 0.35: it stays. A session is never taken."""
    def cycle(since_ckpt: float, kind: str = "batch") -> list:  # type: ignore[type-arg]
        s = Scheduler(tree(), inventory(gpus=1), Policy(short_lane_patience=0.0))
        s.meter.add(ChargeInterval("ca", "a", "x", 1000, NOW - 80 * HOUR, NOW - 10 * HOUR))
        start = NOW - 1800.0 - since_ckpt
        s.submit(job("b1", "b", resumable=True, kind=kind, limit=10 * HOUR), start)
        s.submit(job("d1", "a", kind="debug", limit=600.0, at=1.0), NOW)
        return s.cycle(NOW)

    ds = cycle(60.0)
    (p,) = [d for d in ds if isinstance(d, Preempt)]
    assert p.workload == "b1" and p.reason.startswith("a short debug run")
    assert [d.workload for d in ds if isinstance(d, Start)] == ["d1"]
    assert not [d for d in cycle(600.0) if isinstance(d, Preempt)]
    assert not [d for d in cycle(60.0, kind="interactive") if isinstance(d, Preempt)]
    s = Scheduler(tree(), inventory(gpus=1), Policy(short_lane_cost=0.0,
                                                    short_lane_patience=0.0))
    s.submit(job("b1", "b", resumable=True, limit=10 * HOUR), NOW - 1860.0)
    s.submit(job("d1", "a", kind="debug", limit=600.0, at=1.0), NOW)
    assert not [d for d in s.cycle(NOW) if isinstance(d, Preempt)]


def test_a_debug_run_that_has_waited_may_take_a_dearer_victim() -> None:
    """b1 saved its progress 10 min ago: taking it loses 0.2 GPU-h + the 0.25 toll, over the
    lane's 0.35. A debug run that arrived 2 min ago leaves it; one that has waited 3 min
    (``short_lane_patience``) may take up to ``short_lane_late_cost`` (1.0) and takes it.
    A late cap below the cost still leaves it."""
    def cycle(waited: float, **policy: float) -> list:  # type: ignore[type-arg]
        s = Scheduler(tree(), inventory(gpus=1), Policy(**policy))  # type: ignore[arg-type]
        s.submit(job("b1", "b", resumable=True, limit=10 * HOUR), NOW - 1800.0 - 600.0)
        s.submit(job("d1", "a", kind="debug", limit=600.0, at=NOW - waited), NOW - waited)
        return [d for d in s.cycle(NOW) if isinstance(d, Preempt)]

    assert not cycle(120.0)
    (p,) = cycle(180.0)
    assert (p.workload, p.reason) == ("b1", "a short debug run takes it (loses 0.20 GPU-h)")
    assert not cycle(180.0, short_lane_late_cost=0.44)
    assert not cycle(3600.0, short_lane_patience=0.0)


def test_the_short_lane_empties_a_mig_gpu_to_take_it_whole() -> None:
    """The only GPU is in MIG mode, held whole (7g) by b's batch job that just saved its
    progress. a's debug run takes it the same way a GPU outside MIG mode would be taken."""
    s = Scheduler(tree(), inventory(gpus=1, mig=(0,)), Policy(short_lane_patience=0.0))
    (d,) = s.submit(job("b1", "b", resumable=True, limit=10 * HOUR), NOW - 1860.0)
    assert d.placement.slices[0].profile == "7g.80gb"
    s.submit(job("d1", "a", kind="debug", limit=600.0, at=NOW), NOW)
    ds = s.cycle(NOW)
    assert [(d.workload, d.reason) for d in ds if isinstance(d, Preempt)] == [
        ("b1", "a short debug run takes it (loses 0.05 GPU-h)")]


@pytest.mark.parametrize(("lease", "drain"), [(0.0, 0.0), (HOUR, 0.0), (0.0, 4.0)])
def test_with_leases_a_gpu_freed_between_cycles_is_kept_for_the_short_lane(
        lease: float, drain: float) -> None:
    """4 GPUs, debug work seen before. Three long jobs run; the cycle keeps the fourth GPU
    for the short lane; a debug run takes it. When b1 ends between cycles, its GPU goes to
    the lane first where leases or finished drains are on (every other GPU may be leased or
    busy, with no reserved GPU left idle, so the lane would keep nothing until a cycle found
    one free): the long job x waits. Without either it starts there at once, as before."""
    s = Scheduler(tree(), inventory(gpus=4),
                  Policy(backfill_lease=lease, finish_drain_ratio=drain))
    s.submit(job("d0", kind="debug", limit=600.0), NOW - 1000)
    s.finish("d0", NOW - 400)
    for k in (1, 2, 3):
        s.submit(job(f"b{k}", "b", limit=8 * HOUR, at=float(k)), NOW)
    s.cycle(NOW)
    assert len(s.running) == 3 and len(s.lane.held) == 1  # the fourth GPU is kept
    (st,) = s.submit(job("d1", kind="debug", limit=600.0, at=4.0), NOW + 1)
    assert isinstance(st, Start)
    assert s.submit(job("x", "b", limit=8 * HOUR, at=5.0), NOW + 5) == []
    ds = s.finish("b1", NOW + 10)
    if lease or drain:
        assert ds == [] and "x" in s.pending
    else:
        assert [d.workload for d in ds if isinstance(d, Start)] == ["x"]
