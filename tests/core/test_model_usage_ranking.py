"""The vocabulary (core/model.py), usage (semantics 7: usage = Σ slice fraction × wall time in
the window, or decayed by a half-life) and the order of pending work (semantics 3: lower
standing first, level by level; projected standing; the short lane; kinds within a project)
— by hand."""

from __future__ import annotations

import math

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.model import (
    DAY,
    HOUR,
    ChargeInterval,
    Policy,
    RuntimeHistory,
    SliceRequest,
    Workload,
    _Runs,
    request_milli,
)
from jupyter_gpubudget.core.ranking import (
    INF,
    KIND_ORDER,
    LANE_OFFSET,
    Standings,
    compute_standings,
    kind_rank,
    rank,
    standing_of,
)
from jupyter_gpubudget.core.usage import (
    UsageMeter,
    interval_usage,
    usage_by_project,
    usage_by_span,
)

# ---------------------------------------------------------------- model


def test_request_builders_and_shapes():
    assert SliceRequest.cpu_only(cpu_milli=5, memory_mib=6) == SliceRequest(
        kind="cpu", gpus=0, cpu_milli=5, memory_mib=6)
    assert SliceRequest.whole(3, gpu_model="X") == SliceRequest(kind="gpu", gpus=3,
                                                                gpu_model="X")
    assert SliceRequest.mig("1g.10gb", cpu_milli=2) == SliceRequest(
        kind="mig", gpus=1, profile="1g.10gb", cpu_milli=2)
    assert SliceRequest.mps(250, 1024, memory_mib=3) == SliceRequest(
        kind="mps", gpus=1, milli=250, gpu_memory_mib=1024, memory_mib=3)
    assert SliceRequest.mps(250).gpu_memory_mib == 0
    r = SliceRequest("mps", 1, None, 250, 9, "M", 1, 2, True)
    assert r.shape == ("mps", 1, None, 250, 9, "M", 1, 2, True, None, None)
    assert SliceRequest.whole(2, cluster="a").shape != SliceRequest.whole(2, cluster="b").shape
    assert SliceRequest.whole(2).shape != SliceRequest.whole(2, single_node=True).shape
    assert hash(SliceRequest.whole(2).shape) == hash(SliceRequest.whole(2).shape)


def test_request_milli_edges():
    assert request_milli(SliceRequest.whole(0)) == 0
    assert request_milli(SliceRequest(kind="gpu", gpus=-2)) == 0
    assert request_milli(SliceRequest.mig("4g.40gb")) == 571
    assert request_milli(SliceRequest.mig("7g.141gb")) == 1000
    assert request_milli(SliceRequest(kind="mig", profile=None)) == 0
    assert request_milli(SliceRequest.mig("xg.10gb")) == 0


def test_protection_ends_at_protected_until():
    w = Workload("w", "p", "u", SliceRequest.whole(1), 0.0, backed=True, protected_until=100.0)
    assert w.is_protected(99.9) and not w.is_protected(100.0)
    assert not Workload("w", "p", "u", SliceRequest.whole(1), 0.0, backed=False,
                        protected_until=100.0).is_protected(50.0)
    assert not Workload("w", "p", "u", SliceRequest.whole(1), 0.0, backed=True).is_protected(0)
    assert not w.running and Workload("w", "p", "u", SliceRequest.whole(1), 0.0).stops_at_once


def test_policy_answers_per_kind():
    p = Policy()
    assert (p.cap_for("interactive"), p.cap_for("batch"), p.cap_for("debug")) == (
        8 * HOUR, 2 * DAY, HOUR)
    assert p.cap_for("other") == 0.0
    w = Workload("w", "p", "u", SliceRequest.whole(1), 0.0, kind="debug", min_runtime=2 * HOUR)
    assert p.effective_min_runtime(w) == HOUR
    w.min_runtime = -5.0
    assert p.effective_min_runtime(w) == 0.0
    w.min_runtime = 600.0
    assert p.effective_min_runtime(w) == 600.0
    assert p.checkpoint_interval_of(w) == 1800.0
    w.kind = "interactive"
    assert p.checkpoint_interval_of(w) == 0.0
    w.checkpoint_interval = -3.0
    assert p.checkpoint_interval_of(w) == 0.0
    w.checkpoint_interval = 60.0
    assert p.checkpoint_interval_of(w) == 60.0
    assert p.restart_overhead_of(w) == 120.0
    w.restart_overhead = -1.0
    assert p.restart_overhead_of(w) == 0.0
    w.restart_overhead = 0.0
    assert p.restart_overhead_of(w) == 0.0


def test_runs_keep_the_newest_and_their_quantiles():
    r = _Runs(3)
    for x in (5.0, 1.0, 4.0):
        r.add(x)
    assert (r.recent, r.ordered, len(r)) == ([5.0, 1.0, 4.0], [1.0, 4.0, 5.0], 3)
    r.add(2.0)  # 5.0, the oldest, goes
    assert (r.recent, r.ordered) == ([1.0, 4.0, 2.0], [1.0, 2.0, 4.0])
    assert r.quantile(0.0) == 1.0 and r.quantile(0.5) == 2.0 and r.quantile(0.99) == 4.0
    assert r.quantile(1.0) == 4.0


def test_runtime_history_keeps_per_key_and_counts_versions():
    h = RuntimeHistory(keep=4)
    for x in (1.0, 2.0, 3.0):
        h.add("u", "p", "batch", x, keep=2, shape="gpu:1", command="c")
    assert h.samples[("u", "p", "batch")] == [2.0, 3.0]
    assert h.pooled[("p", "batch")] == [2.0, 3.0]
    assert (h.version, h.kind_version) == (3, {"batch": 3})
    assert len(h.runs[("k", "batch")]) == 3  # feature keys keep max(keep, h.keep) = 4
    assert set(h.runs) == {("k", "batch"), ("p", "p", "batch"), ("u", "u", "p", "batch"),
                           ("uc", "u", "p", "batch", "c"), ("ks", "batch", "gpu:1"),
                           ("ps", "p", "batch", "gpu:1"), ("us", "u", "p", "batch", "gpu:1"),
                           ("usc", "u", "p", "batch", "gpu:1", "c")}
    h.add("v", "p", "debug", 9.0)
    assert h.kind_version == {"batch": 3, "debug": 1} and h.version == 4
    for x in range(10):
        h.add("u", "p", "batch", float(x), keep=100)
    # a key keeps the length it was created with; samples keep what each call says
    assert len(h.runs[("k", "batch")]) == 4 and h.runs[("k", "batch")].recent[-1] == 9.0
    assert len(h.samples[("u", "p", "batch")]) == 12
    w = Workload("w", "p", "u", SliceRequest.mig("1g.10gb"), 0.0, kind="debug", command="run")
    h.add_run(w, 42.0)
    assert h.runs[("usc", "u", "p", "debug", "mig:1g.10gb", "run")].recent == [42.0]
    assert h.samples[("u", "p", "debug")] == [42.0]


# ---------------------------------------------------------------- usage


def test_interval_usage_in_a_window_and_with_a_half_life():
    p = Policy(window=10 * HOUR)
    now = 100 * HOUR
    assert interval_usage(500, 95 * HOUR, 99 * HOUR, now, p) == 2.0
    assert interval_usage(1000, 80 * HOUR, 95 * HOUR, now, p) == 5.0  # clipped at 90 h
    assert interval_usage(1000, 80 * HOUR, 90 * HOUR, now, p) == 0.0
    assert interval_usage(1000, 99 * HOUR, 110 * HOUR, now, p) == 1.0  # only up to now
    assert interval_usage(1000, 100 * HOUR, 101 * HOUR, now, p) == 0.0
    assert interval_usage(1000, 99 * HOUR, 98 * HOUR, now, p) == 0.0
    h = Policy(half_life=HOUR)
    # ∫ 2^-((now - t)/h) dt over the last hour = h/ln2 · (1 − 1/2) hours
    assert interval_usage(1000, now - HOUR, now, now, h) == pytest.approx(0.5 / math.log(2))
    assert interval_usage(2000, now - 2 * HOUR, now - HOUR, now, h) == pytest.approx(
        2 * 0.25 / math.log(2))


def test_usage_by_project_and_by_span():
    p = Policy(window=10 * HOUR)
    now = 100 * HOUR
    cs = [ChargeInterval("a", "x", "u", 1000, 95 * HOUR, 96 * HOUR),
          ChargeInterval("b", "x", "u", 500, 98 * HOUR, None),
          ChargeInterval("c", "y", "u", 1000, 10 * HOUR, 20 * HOUR)]
    assert usage_by_project(cs, now, p) == {"x": 2.0}
    spans = [(96 * HOUR, 98 * HOUR), (98 * HOUR, 99 * HOUR), (99 * HOUR, 120 * HOUR)]
    assert usage_by_span(cs, spans, now) == [0.0, 0.5, 0.5]
    assert usage_by_span(cs, [(0.0, 15 * HOUR), (15 * HOUR, 95.5 * HOUR)], now) == [5.0, 5.5]
    assert usage_by_span([], spans, now) == [0.0, 0.0, 0.0]


def test_the_meter_keeps_closed_and_open_intervals():
    m = UsageMeter(Policy(window=10 * HOUR))
    assert m.horizon == 10 * HOUR
    m.add(ChargeInterval("z", "x", "u", 1000, 5.0, 5.0))  # empty: dropped
    m.add(ChargeInterval("o", "x", "u", 1000, 0.0, None))  # open
    m.open_interval("w", "y", "u", 250, 0.0)
    assert set(m.open) == {"o", "w"} and m.closed == {}
    assert m.usage(4 * HOUR) == {"x": 4.0, "y": 1.0}
    done = m.close("w", 2 * HOUR)
    assert done == ChargeInterval("w", "y", "u", 250, 0.0, 2 * HOUR)
    assert m.close("w", 3 * HOUR) is None
    assert m.close("o", -5.0).end == 0.0  # never before its start: counts nothing
    assert m.usage(4 * HOUR) == {"y": 0.5}
    assert m.usage(12 * HOUR) == {}  # out of the window: forgotten
    # closed intervals are kept per project and user (a member's usage inside the project)
    assert m.closed[("y", "u")] == type(m.closed[("y", "u")])() and m.charges() == []
    m.open_interval("v", "y", "u", 1000, 12 * HOUR)
    assert m.charges() == [ChargeInterval("v", "y", "u", 1000, 12 * HOUR, None)]
    out = {"y": 1.0}
    m.add_open(out, 13 * HOUR)
    assert out == {"y": 2.0}
    assert UsageMeter(Policy(half_life=HOUR)).horizon == 20 * HOUR
    m2 = UsageMeter(Policy(window=10 * HOUR))
    m2.add(ChargeInterval("a", "x", "u", 1000, 0.0, HOUR))
    m2.add(ChargeInterval("b", "x", "u", 1000, HOUR, 3 * HOUR))
    m2.forget_old(11 * HOUR)  # the first ended exactly at the horizon: gone
    assert [c.workload for c in m2.closed[("x", "u")]] == ["b"]


# ---------------------------------------------------------------- ranking

TREE = load_budgets("""
accounts:
  p1:
    grant: 100
    children:
      a: {grant: 50}
      b: {grant: 50}
  p2:
    grant: 100
    children:
      c: {grant: 100}
  zero: {grant: 0}
""").accounts


def test_standings_level_by_level():
    assert standing_of(5.0, 10.0) == 0.5 and standing_of(5.0, 0.0) == INF
    assert standing_of(0.0, 0.0) == INF
    st = compute_standings(TREE, {"a": 10.0, "c": 30.0, "ghost": 5.0, "p1": 99.0},
                           TREE.effective_grants(0.0))
    assert st.usage == {"p1": 10.0 + 99.0, "a": 10.0, "b": 0.0, "p2": 30.0, "c": 30.0,
                        "zero": 0.0}
    assert st.standing["a"] == 0.2 and st.standing["zero"] == INF
    assert st.path_standing == {"a": (1.09, 0.2), "b": (1.09, 0.0), "c": (0.3, 0.3),
                                "zero": (INF,)}
    assert kind_rank("debug") == 0 and kind_rank("interactive") == 1
    assert kind_rank("batch") == 2 and kind_rank("other") == 2 and KIND_ORDER["batch"] == 2


def w(wid, project, at=0.0, kind="batch", gpus=1):
    return Workload(wid, project, "u", SliceRequest.whole(gpus), at, kind=kind)


def test_rank_by_projected_standing_and_kind():
    """a and c start at 0; each workload adds its demand (GPU-hours) to its project's
    projected usage: a's 10-hour first job puts a's next at 10/50 in a, but p1 stands at
    10/100 while c (5 h each) goes 0, 0.05, ... in p2 at 5/100 steps."""
    st = compute_standings(TREE, {}, TREE.effective_grants(0.0))
    demand = {"a1": 10.0, "a2": 1.0, "c1": 5.0, "c2": 5.0, "c3": 5.0, "n1": 1.0, "z1": 1.0}
    pend = [w("a1", "a", 0), w("a2", "a", 1), w("c1", "c", 2), w("c2", "c", 3),
            w("c3", "c", 4), w("n1", "nope", 0), w("z1", "zero", 0)]
    got = rank(pend, TREE, st, lambda x: demand[x.id])
    # root keys: a1 0, c1 0 (a1 first: earlier), c2 0.05, a2 0.1, c3 0.1 (a2 first: earlier)
    assert [(k, x.id) for k, x in got] == [(0.0, "a1"), (0.0, "c1"), (0.05, "c2"),
                                           (0.1, "a2"), (0.1, "c3"), (INF, "z1")]
    # within a project: debug, then interactive, then batch, each by submission
    pend = [w("b-batch", "b", 0), w("b-nb", "b", 5, "interactive"), w("b-dbg", "b", 9, "debug"),
            w("b-nb0", "b", 1, "interactive")]
    got = [x.id for _, x in rank(pend, TREE, st, lambda x: 1.0)]
    assert got == ["b-dbg", "b-nb0", "b-nb", "b-batch"]
    # the short lane goes first, ranked the same way among itself, its keys lowered
    pend = [w("c1", "c", 0), w("a-dbg", "a", 5, "debug"), w("c-dbg", "c", 6, "debug")]
    got = rank(pend, TREE, st, lambda x: 1.0, short=lambda x: x.kind == "debug")
    assert [(k, x.id) for k, x in got] == [(-LANE_OFFSET, "a-dbg"), (-LANE_OFFSET, "c-dbg"),
                                           (0.0, "c1")]
    assert [x.id for _, x in rank(pend, TREE, st, lambda x: 1.0, short=lambda x: False)] == [
        "a-dbg", "c-dbg", "c1"]


def test_rank_merges_children_by_their_own_standing():
    """b (used 40 of 50) stands above a (used 0): in p1, a's jobs go before b's although
    b's were submitted first; ties go to the kind, then submission."""
    st = compute_standings(TREE, {"b": 40.0}, TREE.effective_grants(0.0))
    pend = [w("b1", "b", 0), w("b2", "b", 1), w("a1", "a", 5), w("a2", "a", 6)]
    got = [x.id for _, x in rank(pend, TREE, st, lambda x: 10.0)]
    # a: 0, 0.2 (a's key); b: 0.8, 1.0 — merged in p1 by (child key, kind, submission)
    assert got == ["a1", "a2", "b1", "b2"]
    keys = [k for k, _ in rank(pend, TREE, st, lambda x: 10.0)]
    assert keys == [0.4, 0.5, 0.6, 0.7]  # p1's projected standing: (40 + 10 k) / 100


FLAT = load_budgets("""
accounts:
  x: {grant: 1}
  y: {grant: 1}
  z: {grant: 1}
""").accounts


def test_rank_reads_missing_figures_as_nothing():
    """An account the standings carry no grant for stands behind every funded one (∞); one
    they carry no usage for has used nothing; a grant under one GPU-hour still divides."""
    st = Standings(usage={"x": 0.25}, grant={"x": 0.5, "z": 2.0}, standing={}, path_standing={})
    pend = [w("y1", "y", 0), w("x1", "x", 1), w("z1", "z", 2)]
    got = [(k, x.id) for k, x in rank(pend, FLAT, st, lambda x: 1.0)]
    assert got == [(0.0, "z1"), (0.5, "x1"), (INF, "y1")]
    # compute_standings: an account missing from the grants has none
    st = compute_standings(TREE, {"a": 1.0}, {"p1": 100.0})
    assert st.standing["a"] == INF and st.standing["p1"] == 0.01
    assert st.path_standing["a"] == (0.01, INF)


def test_rank_ties_across_projects_go_to_the_kind_first():
    """x and y stand equal: y's notebook, submitted later, goes before x's batch job."""
    st = Standings(usage={}, grant={"x": 1.0, "y": 1.0}, standing={}, path_standing={})
    pend = [w("x-batch", "x", 0), w("y-nb", "y", 5, "interactive"), w("z-dbg", "z", 9, "debug")]
    got = [(k, x.id) for k, x in rank(pend, FLAT, st, lambda x: 1.0)]
    assert got == [(0.0, "y-nb"), (0.0, "x-batch"), (INF, "z-dbg")]


def test_the_meter_keeps_what_it_is_told_and_drops_empty_intervals():
    m = UsageMeter(Policy(window=10 * HOUR))
    m.add(ChargeInterval("z", "x", "u", 1000, 5.0, 5.0))  # no time: nothing charged
    m.open_interval("w", "y", "ann", 250, 7.0)
    assert m.charges() == [ChargeInterval("w", "y", "ann", 250, 7.0, None)]
    assert m.close("w", 7.0) == ChargeInterval("w", "y", "ann", 250, 7.0, 7.0)
    assert m.charges() == []  # closed at its start: nothing to keep


def test_run_history_keeps_fifty_and_plain_keys_without_slice_or_command():
    h = RuntimeHistory()
    for x in range(50):
        h.add("u", "p", "batch", float(x))
    assert len(h.samples[("u", "p", "batch")]) == 50 and len(h.pooled[("p", "batch")]) == 50
    h.add("u", "p", "batch", 50.0)
    assert h.samples[("u", "p", "batch")] == [float(x) for x in range(1, 51)]
    assert set(h.runs) == {("k", "batch"), ("p", "p", "batch"), ("u", "u", "p", "batch")}
