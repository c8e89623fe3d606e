"""Reservations and run-time prediction (docs/core.md, "Reservations and backfill",
semantics 5), by hand: when and where a blocked gang's GPUs come free as running work ends,
and the predictions those times rest on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from jupyter_gpubudget.core.backfill import (
    MIN_RUNS,
    plain_p90,
    plan_reservation,
    predict_runtime,
    predicted_end,
)
from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import (
    Placement,
    Policy,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Workload,
)

H100 = "H100-80GB"


def cluster(*nodes) -> Cluster:
    """A capacity model whose gangs accept any links (``interconnect: any``): these tests
    are about reservations' mechanics; the interconnect's rules are test_interconnect.py's."""
    c = Cluster(Inventory(tuple(nodes)))
    c.default_interconnect = "any"
    return c


def hold(c: Cluster, wid: str, node: str, *gpus: int, kind: str = "gpu") -> None:
    milli = 1000 if kind == "gpu" else 500
    c.allocate(wid, Placement(tuple(SliceAlloc(node, g, kind, milli) for g in gpus)))


def where(plan) -> tuple[float, list[tuple[str, int]]]:
    at, p = plan
    assert all(s.kind == "gpu" and s.milli == 1000 for s in p.slices)
    return at, [(s.node, s.gpu) for s in p.slices]


def test_a_reservation_is_the_earliest_time_enough_gpus_come_free():
    c = cluster(make_node("n0", H100, 2), make_node("n1", H100, 2))
    hold(c, "a", "n0", 0)
    hold(c, "b", "n0", 1)
    hold(c, "c", "n1", 0, 1)
    ends = [(50.0, "a"), (80.0, "c"), (90.0, "b")]
    # 2 GPUs on one node: n1's pair at 80 (n0's a at 50 gives only one)
    assert where(plan_reservation(c, SliceRequest.whole(2, single_node=True), 10.0, ends)) \
        == (80.0, [("n1", 0), ("n1", 1)])
    # 3 GPUs across nodes at 80: the node with the most first
    assert where(plan_reservation(c, SliceRequest.whole(3), 10.0, ends)) == (
        80.0, [("n1", 0), ("n1", 1), ("n0", 0)])
    assert where(plan_reservation(c, SliceRequest.whole(4), 10.0, ends))[0] == 90.0
    assert plan_reservation(c, SliceRequest.whole(5), 10.0, ends) is None
    # work already past its end counts from now
    assert where(plan_reservation(c, SliceRequest.whole(1), 60.0, ends)) == (60.0, [("n0", 0)])
    # what is free now needs nothing to end
    c.release("c")
    assert where(plan_reservation(c, SliceRequest.whole(2), 10.0, ends)) == (
        10.0, [("n1", 0), ("n1", 1)])


def test_a_reservation_skips_what_it_may_not_use():
    c = cluster(make_node("n0", H100, 2), make_node("n1", "A100-80GB", 2),
                make_node("n2", H100, 1))
    hold(c, "a", "n0", 0)
    hold(c, "s", "n0", 1, kind="mps")  # a share's GPU is not counted as coming free
    hold(c, "x", "n1", 0, 1)
    hold(c, "z", "n2", 0)
    ends = [(20.0, "gone"), (30.0, "s"), (40.0, "x"), (50.0, "a"), (60.0, "z")]
    c.reserve(Placement((SliceAlloc("n2", 0),)), 70.0)  # another gang's
    req = SliceRequest.whole(2, gpu_model=H100)
    assert plan_reservation(c, req, 0.0, ends) is None
    assert where(plan_reservation(c, SliceRequest.whole(2), 0.0, ends)) == (
        40.0, [("n1", 0), ("n1", 1)])
    c.set_healthy("n1", False)
    assert where(plan_reservation(c, SliceRequest.whole(1, gpu_model="A100-80GB|H100-80GB"),
                                  0.0, ends)) == (50.0, [("n0", 0)])
    assert plan_reservation(c, SliceRequest.whole(2), 0.0, ends) is None
    c.clear_reservations()
    assert where(plan_reservation(c, SliceRequest.whole(2), 0.0, ends)) == (
        60.0, [("n0", 0), ("n2", 0)])
    # free GPUs on an unhealthy node are not counted either
    c2 = cluster(make_node("n0", H100, 1), make_node("n1", H100, 1))
    c2.set_healthy("n1", False)
    assert plan_reservation(c2, SliceRequest.whole(2), 0.0, []) is None
    assert where(plan_reservation(c2, SliceRequest.whole(1), 5.0, [])) == (5.0, [("n0", 0)])


# ---------------------------------------------------------------- predictions


def w(**kw) -> Workload:
    return Workload("w", "p", "u", SliceRequest.whole(1), 0.0, **kw)


def test_a_key_counts_from_three_runs_and_sub_second_runs_count_as_one_second():
    h = RuntimeHistory()
    assert MIN_RUNS == 3
    for x in (0.2, 0.5):
        h.add("u", "p", "batch", x, shape="gpu:1")
    assert predict_runtime(w(), h, Policy()) == Policy().default_runtime
    h.add("u", "p", "batch", 0.7, shape="gpu:1")
    assert predict_runtime(w(), h, Policy()) == 1.0  # log(max(q, 1 s)): never below 1 s
    assert predict_runtime(w(time_limit=0.5), h, Policy()) == 1.0


def test_only_the_kinds_runs_known_the_declared_limit_wins():
    """Other users' and projects' runs of the kind and slice are known (kind and slice
    keys): a job that declares a limit is predicted at it; one that does not, at them. Its
    own user's runs (a user key) count as its own."""
    h = RuntimeHistory()
    for x in (100.0, 100.0, 100.0):
        h.add("v", "other", "batch", x, shape="gpu:1")
    assert predict_runtime(w(time_limit=900.0), h, Policy()) == 900.0
    assert predict_runtime(w(), h, Policy()) == pytest.approx(100.0)
    for x in (300.0, 300.0, 300.0):
        h.add("u", "p", "batch", x, shape="gpu:1")
    # kind, slice: 6 runs at 0.6 → 300; project and user keys: 3 runs of 300 → 300
    assert predict_runtime(w(time_limit=900.0), h, Policy()) == pytest.approx(300.0)
    # a slice never learnt: the plain chain (kind, project, user)
    mig = Workload("m", "p", "u", SliceRequest.mig("1g.10gb"), 0.0)
    assert predict_runtime(mig, h, Policy()) == pytest.approx(300.0)
    # the command refines the user's key
    for x in (60.0, 60.0, 60.0):
        h.add("u", "p", "batch", x, shape="gpu:1", command="fast.py")
    cmd = replace(w(), command="fast.py")
    n, est = 3, math.log(300.0)
    # kind/slice: 9 runs, the 0.6-quantile index 5 of sorted [60×3, 100×3, 300×3] → 100
    est = math.log(100.0)
    for key_runs, q in ((6, 300.0), (6, 300.0), (3, 60.0)):  # project, user, user+command
        n = key_runs
        est = (n * math.log(q) + 4 * est) / (n + 4)
    assert predict_runtime(cmd, h, Policy()) == pytest.approx(math.exp(est))


def test_plain_p90_from_the_users_runs_then_the_projects_then_the_limit():
    h = RuntimeHistory()
    for x in (10.0, 20.0):
        h.add("u", "p", "batch", x)
    for x in (100.0, 200.0, 300.0):
        h.add("v", "p", "batch", x)
    # u has 2 runs (too few): the project's 5: index int(0.9 · 5) = 4 of [10, 20, 100, 200,
    # 300] → 300
    assert plain_p90(w(), h, Policy()) == 300.0
    h.add("u", "p", "batch", 30.0)
    assert plain_p90(w(), h, Policy()) == 30.0  # u's own three
    assert plain_p90(w(time_limit=25.0), h, Policy()) == 25.0
    assert plain_p90(w(kind="debug"), h, Policy()) == Policy().default_runtime
    assert plain_p90(w(kind="debug", time_limit=0.1), h, Policy()) == 1.0
    h2 = RuntimeHistory()
    for x in (1.0, 2.0):
        h2.add("v", "p", "batch", x)
    assert plain_p90(w(time_limit=50.0), h2, Policy()) == 50.0  # 2 pooled runs: too few


def test_predicted_end_edges():
    x = w(started_at=100.0)
    assert predicted_end(x, 150.0, 100.0) == 200.0
    assert predicted_end(x, 200.0, 100.0) == 260.0  # at its end: at least a minute more
    assert predicted_end(x, 400.0, 100.0) == 550.0  # 300 s in: 150 s more
    # past its declared limit (at 350): the limit says nothing more
    assert predicted_end(replace(x, time_limit=250.0), 400.0, 100.0) == 550.0
    assert predicted_end(replace(x, time_limit=350.0), 400.0, 100.0) == 450.0  # the limit
    assert predicted_end(replace(x, time_limit=300.0), 400.0, 100.0) == 550.0  # at it: passed
    assert predicted_end(replace(x, started_at=None), 50.0, 30.0) == 80.0


def test_reservations_at_their_edges():
    # free GPUs: an unhealthy first node does not end the search; a free GPU already
    # reserved for another gang is not offered again, whatever the model filter
    c = cluster(make_node("n0", H100, 1), make_node("n1", H100, 1),
                make_node("n2", "A100-80GB", 1))
    c.set_healthy("n0", False)
    assert where(plan_reservation(c, SliceRequest.whole(1), 0.0, [])) == (0.0, [("n1", 0)])
    c.reserve(Placement((SliceAlloc("n1", 0),)), 50.0)
    assert where(plan_reservation(c, SliceRequest.whole(1), 0.0, [])) == (0.0, [("n2", 0)])
    assert plan_reservation(c, SliceRequest.whole(1, gpu_model=H100), 0.0, []) is None
    c.clear_reservations()
    assert where(plan_reservation(c, SliceRequest.whole(1, gpu_model="A100-80GB"), 0.0,
                                  [])) == (0.0, [("n2", 0)])
    # across nodes holding as many free GPUs each: node order, and no more GPUs than asked
    c = cluster(make_node("n0", H100, 4), make_node("n1", H100, 4), make_node("n2", H100, 4))
    hold(c, "a", "n0", 0, 1, 2)
    hold(c, "b", "n1", 0, 1, 3)
    hold(c, "d", "n2", 1, 2, 3)
    assert where(plan_reservation(c, SliceRequest.whole(2), 0.0, [])) == (
        0.0, [("n0", 3), ("n1", 2)])
    c = cluster(make_node("n0", H100, 2), make_node("n1", H100, 2))
    assert where(plan_reservation(c, SliceRequest.whole(3), 0.0, [])) == (
        0.0, [("n0", 0), ("n0", 1), ("n1", 0)])
    # a workload holding a share and a whole GPU frees the whole GPU when it ends
    c = cluster(make_node("n0", H100, 2))
    c.allocate("m", Placement((SliceAlloc("n0", 0, "mps", 500), SliceAlloc("n0", 1))))
    assert where(plan_reservation(c, SliceRequest.whole(1), 0.0, [(30.0, "m")])) == (
        30.0, [("n0", 1)])


def test_plain_p90_edges():
    h = RuntimeHistory()
    for x in (100.0, 200.0, 300.0):
        h.add("v", "p", "batch", x)
    assert plain_p90(w(), h, Policy()) == 300.0  # exactly three pooled runs count
    h2 = RuntimeHistory()
    for x in range(1, 21):
        h2.add("u", "p", "batch", float(x))
    assert plain_p90(w(), h2, Policy()) == 19.0  # index int(0.9 · 20) = 18 of 1..20


def test_the_slice_a_job_asks_for_refines_its_prediction():
    """Runs of one GPU take 100 s, runs of two 1000 s: a one-GPU job is predicted from the
    kind's runs (both), then refined by the one-GPU runs of the kind, project and user."""
    h = RuntimeHistory()
    for _ in range(3):
        h.add("u", "p", "batch", 100.0, shape="gpu:1")
        h.add("u", "p", "batch", 1000.0, shape="gpu:2")
    est = math.log(1000.0)  # the kind: index int(0.6 · 6) = 3 of [100 ×3, 1000 ×3]
    for _ in ("ks", "ps", "us"):  # three keys of 3 one-GPU runs at 100 s
        est = (3 * math.log(100.0) + 4 * est) / 7
    assert predict_runtime(w(), h, Policy()) == pytest.approx(math.exp(est))
    two = Workload("t", "p", "u", SliceRequest.whole(2), 0.0)
    est2 = math.log(1000.0)
    for _ in ("ks", "ps", "us"):
        est2 = (3 * math.log(1000.0) + 4 * est2) / 7
    assert predict_runtime(two, h, Policy()) == pytest.approx(math.exp(est2))
    # a slice never learnt: the plain chain (kind, project, user), not the kind alone
    h3 = RuntimeHistory()
    for _ in range(3):
        h3.add("u", "p", "batch", 100.0, shape="gpu:1")
        h3.add("u", "p", "batch", 1000.0, shape="gpu:2")
    for _ in range(6):
        h3.add("v", "q", "batch", 5000.0, shape="gpu:1")
    mig = Workload("m", "p", "u", SliceRequest.mig("1g.10gb"), 0.0)
    est3 = math.log(5000.0)  # the kind: index int(0.6 · 12) = 7 of [100 ×3, 1000 ×3, 5000 ×6]
    for _ in ("p", "u"):  # six runs each: index 3 of [100 ×3, 1000 ×3]
        est3 = (6 * math.log(1000.0) + 4 * est3) / 10
    assert predict_runtime(mig, h3, Policy()) == pytest.approx(math.exp(est3))
