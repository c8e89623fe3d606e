"""What a session could get (core/offer.py), by hand: the slice choices an inventory offers,
the requests no hardware could ever hold (refused at submission, semantics 8), quotes
(backing, protection and its cost, predicted start: now, when unbacked or idle work yields,
or from the forecast), and the forecast itself."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpubudget.core.inventory import Inventory, carve, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Placement,
    Policy,
    SliceAlloc,
    SliceRequest,
)
from jupyter_gpubudget.core.offer import (
    MPS_SHARES,
    QUOTE_ID,
    Quoter,
    forecast,
    not_offered,
    request_for,
    slice_choices,
    standings_of,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import inventory, job, tree

NOW = 100 * HOUR


def test_slice_choices_of_a_mixed_inventory_by_hand():
    inv = Inventory((
        make_node("a", "H100-80GB", 4, mig=(3,), mig_layout={3: carve(
            "H100-80GB", [("3g.40gb", None), ("1g.10gb", None)])}),
        make_node("b", "A100-40GB", 3, mig=(2,)),
    ))
    got = slice_choices(inv)
    assert got[0] == {"key": "cpu", "label": "CPU only (no GPU)", "kind": "cpu",
                      "fraction": 0.0, "compute": 0.0, "memory_gb": None}
    # whole GPUs: 1, 2 (powers of two up to the most non-MIG GPUs on a node: 3); memory of
    # the smallest non-MIG GPU (A100-40GB: 40960 MiB = 40 GB)
    assert got[1] == {"key": "gpu:1", "label": "1 whole GPU", "kind": "gpu", "fraction": 1.0,
                      "compute": 1.0, "memory_gb": 40, "gpu_memory_gb": 40}
    assert got[2] == {"key": "gpu:2", "label": "2 whole GPUs", "kind": "gpu",
                      "fraction": 2.0, "compute": 2.0, "memory_gb": 80, "gpu_memory_gb": 40}
    migs = [c for c in got if c["kind"] == "mig"]
    # models in name order; a carved GPU offers every profile, a fixed one its own
    assert [c["key"] for c in migs] == [
        "mig:1g.5gb", "mig:1g.10gb", "mig:2g.10gb", "mig:3g.20gb", "mig:4g.20gb",
        "mig:7g.40gb", "mig:1g.10gb", "mig:3g.40gb"]
    assert migs[-1] == {"key": "mig:3g.40gb", "label": "MIG 3g.40gb on H100-80GB (3/7 of a GPU)",
                        "kind": "mig", "gpu_model": "H100-80GB", "fraction": 0.429,
                        "compute": 3 / 7, "memory_gb": 40}
    mps = [c for c in got if c["kind"] == "mps"]
    assert MPS_SHARES == (250, 500)
    assert mps == [
        {"key": "mps:250", "label": "MPS share, 25% of a GPU", "kind": "mps",
         "fraction": 0.25, "compute": 0.25, "memory_gb": None, "gpu_memory_gb": 40},
        {"key": "mps:500", "label": "MPS share, 50% of a GPU", "kind": "mps",
         "fraction": 0.5, "compute": 0.5, "memory_gb": None, "gpu_memory_gb": 40}]
    assert len(got) == 3 + len(migs) + 2


def test_slice_choices_without_whole_gpus_or_memory_figures():
    only_mig = Inventory((make_node("a", "H100-80GB", 2, mig=(0, 1)),))
    keys = [c["key"] for c in slice_choices(only_mig)]
    assert keys == ["cpu", "mig:1g.10gb", "mig:1g.20gb", "mig:2g.20gb", "mig:3g.40gb",
                    "mig:4g.40gb", "mig:7g.80gb"]  # no whole GPU, no MPS share
    unknown = Inventory((make_node("a", "GPU", 8, gpu_memory_mib=0),))
    got = slice_choices(unknown)
    assert [c["key"] for c in got] == ["cpu", "gpu:1", "gpu:2", "gpu:4", "gpu:8", "mps:250",
                                       "mps:500"]
    assert got[4]["memory_gb"] is None and got[4]["gpu_memory_gb"] is None
    assert got[5]["gpu_memory_gb"] is None
    cpu_only = Inventory((make_node("c", "GPU", 0),))
    assert [c["key"] for c in slice_choices(cpu_only)] == ["cpu"]


def test_request_for_every_key():
    assert request_for("cpu") == SliceRequest.cpu_only()
    assert request_for("gpu:4") == SliceRequest.whole(4)
    assert request_for("mig:1g.10gb") == SliceRequest.mig("1g.10gb")
    assert request_for("mps:250") == SliceRequest.mps(250)
    assert request_for("other") == SliceRequest.cpu_only()


def test_requests_no_hardware_could_ever_hold_are_named():
    inv = Inventory((make_node("a", "H100-80GB", 4, mig=(3,)),
                     make_node("b", "A100-40GB", 2, mig=(1,), gpu_memory_mib=40000)))
    ok = [SliceRequest.whole(3, single_node=True), SliceRequest.whole(4),
          SliceRequest.mig("1g.5gb"),
          SliceRequest.mps(500, 80000), SliceRequest.cpu_only(),
          SliceRequest.whole(1, gpu_model="A100-40GB|H100-80GB")]
    for req in ok:
        assert not_offered(inv, req) is None, req
    assert not_offered(inv, SliceRequest.whole(1, gpu_model="T4|A100-40GB")) == (
        "gpu_model", "no GPU of model 'T4' here (models: A100-40GB, H100-80GB)")
    assert not_offered(Inventory((make_node("c", "GPU", 0),)), SliceRequest.whole(
        1, gpu_model="T4")) == ("gpu_model", "no GPU of model 'T4' here (models: none)")
    assert not_offered(inv, SliceRequest.mig("9g.99gb")) == (
        "slice", "no MIG-partitioned GPU here offers '9g.99gb' (offered: 1g.10gb, 1g.20gb, "
        "1g.5gb, 2g.10gb, 2g.20gb, 3g.20gb, 3g.40gb, 4g.20gb, 4g.40gb, 7g.40gb, 7g.80gb)")
    assert not_offered(inv, SliceRequest.mig("1g.5gb", gpu_model="H100-80GB"))[0] == "slice"
    assert not_offered(Inventory((make_node("c", "T4", 1),)), SliceRequest.mig("1g.5gb")) == (
        "slice", "no MIG-partitioned GPU here offers '1g.5gb' (offered: none)")
    assert not_offered(inv, SliceRequest.whole(4, single_node=True)) == (
        "gpus", "at most 3 whole GPUs on one node")
    assert not_offered(inv, SliceRequest.whole(4)) is None
    assert not_offered(inv, SliceRequest.whole(5)) == ("gpus", "the cluster has 4 whole GPUs")
    assert not_offered(inv, SliceRequest.whole(2, gpu_model="A100-40GB", single_node=True)) \
        == ("gpus", "at most 1 whole GPUs on one node")
    assert not_offered(inv, SliceRequest.whole(2, gpu_model="A100-40GB")) == (
        "gpus", "the cluster has 1 whole GPUs")
    assert not_offered(inv, SliceRequest.mps(100, 81560)) == (
        "slice", "an MPS share of 81560 MiB is more than a GPU here has (81559 MiB)")
    assert not_offered(inv, SliceRequest.mps(100, 81559)) is None
    assert not_offered(inv, SliceRequest.mps(100, 40001, gpu_model="A100-40GB")) == (
        "slice", "an MPS share of 40001 MiB is more than a GPU here has (40000 MiB)")
    assert not_offered(Inventory((make_node("m", "H100-80GB", 1, mig=(0,)),)),
                       SliceRequest.mps(100)) == ("slice", "no GPU here takes MPS shares")
    assert not_offered(Inventory((make_node("u", "GPU", 1, gpu_memory_mib=0),)),
                       SliceRequest.mps(100, 10**9)) is None
    assert not_offered(Inventory((make_node("c", "GPU", 0),)), SliceRequest.whole(1)) == (
        "gpus", "the cluster has 0 whole GPUs")


# ---------------------------------------------------------------- quotes


def quoter(state: ClusterState, now: float = NOW) -> Quoter:
    s = Scheduler.from_state(state)
    s.cycle(now)
    return Quoter(s, forecast(state, now, probes={"gpu:1": SliceRequest.whole(1),
                                                   "gpu:2": SliceRequest.whole(2)}), now)


def running(wid, project, gpu, *, backed=True, idle=False, stops_at_once=True, kind="batch",
            start=NOW - 600, protected_until=None, limit=10 * HOUR):
    w = job(wid, project, kind=kind, limit=limit)
    return replace(w, started_at=start, backed=backed, idle=idle, stops_at_once=stops_at_once,
                   protected_until=protected_until,
                   placement=Placement((SliceAlloc("n0", gpu),)))


def test_a_quote_that_fits_now_prices_its_protection():
    q = quoter(ClusterState(tree(), inventory(gpus=2)))
    got = q.quote("ann", "a", "gpu:2", SliceRequest.whole(2), 3 * HOUR, NOW)
    assert got == {"backed": True, "fraction": 2.0, "protected_s": 3 * HOUR,
                   "starts_now": True, "predicted_start": NOW, "why": "fits free capacity now",
                   "cost_gpu_hours": 6.0}
    # interactive protection is capped at 8 h
    got = q.quote("ann", "a", "mps:500", SliceRequest.mps(500), 20 * HOUR, NOW)
    assert (got["protected_s"], got["cost_gpu_hours"], got["fraction"]) == (8 * HOUR, 4.0, 0.5)
    # a project whose grant does not cover the protected time: unbacked, nothing protected
    # (a has used 90 of its 100 GPU-hours; 2 GPUs for 8 h need 16)
    q = quoter(ClusterState(tree(), inventory(gpus=2), charges=[
        ChargeInterval("c", "a", "x", 1000, NOW - 90 * HOUR, NOW)]))
    assert q.quote("ann", "a", "gpu:2", SliceRequest.whole(2), 5 * HOUR, NOW)["backed"]
    got = q.quote("ann", "a", "gpu:2", SliceRequest.whole(2), 60 * HOUR, NOW)
    assert got["backed"] is False and got["protected_s"] == 0.0 and got["cost_gpu_hours"] == 0
    assert got["note"].startswith("unbacked: the project's grant does not cover")
    assert "note" not in q.quote("ann", "a", "gpu:1", SliceRequest.whole(1), 0.0, NOW)
    got = q.quote("ann", "nope", "gpu:1", SliceRequest.whole(1), HOUR, NOW)
    assert got["backed"] is False
    assert q.quote("ann", "a", "cpu", SliceRequest.cpu_only(), HOUR, NOW)["fraction"] == 0.0
    assert round(q.quote("ann", "a", "mig", SliceRequest.mig("3g.40gb"), HOUR, NOW)[
        "fraction"], 3) == 0.429


def test_a_quote_behind_work_that_yields_starts_now_or_after_the_stop_grace():
    charges = [ChargeInterval("old", "b", "x", 1000, NOW - 150 * HOUR, NOW - HOUR)]
    for victim, start in ((running("u", "b", 0, backed=False), NOW),
                          (running("s", "b", 0, backed=False, stops_at_once=False),
                           NOW + Policy().stop_grace),
                          (running("i", "b", 0, idle=True, kind="interactive"), NOW)):
        q = quoter(ClusterState(tree(), inventory(gpus=1), running=[victim], charges=charges))
        got = q.quote("ann", "a", "gpu:1", SliceRequest.whole(1), HOUR, NOW)
        assert got["predicted_start"] == start, victim.id
        assert got["starts_now"] is (start == NOW)
        assert got["why"] == "unbacked or idle work yields to it"
        # what stays (nothing): the quote changed nothing in the scheduler
        assert QUOTE_ID not in q.sched.pending and QUOTE_ID not in q.sched.running
    # backed work that is not idle does not yield: the forecast says when it ends
    busy = running("b1", "b", 0, limit=5 * HOUR)
    q = quoter(ClusterState(tree(), inventory(gpus=1), running=[busy]))
    got = q.quote("ann", "a", "gpu:1", SliceRequest.whole(1), HOUR, NOW)
    assert got["predicted_start"] == NOW - 600 + 5 * HOUR
    assert got["starts_now"] is False
    assert got["why"] == "when running work ends and the queue ahead is served"
    # protected unbacked work is not protected; protected backed work does not yield
    prot = running("p", "b", 0, protected_until=NOW + HOUR)
    q = quoter(ClusterState(tree(), inventory(gpus=1), running=[prot]))
    assert q._yielding(job("x", "a"), NOW + HOUR, NOW) is None
    # an unbacked quote never preempts: it waits for the forecast
    q = quoter(ClusterState(tree(), inventory(gpus=1), running=[running("u", "b", 0,
                                                                        backed=False)],
                            charges=charges))
    got = q.quote("ann", "b", "gpu:1", SliceRequest.whole(1), 0.0, NOW)
    assert got["backed"] is False and got["why"] != "unbacked or idle work yields to it"


def test_a_quote_outside_the_forecast_says_so():
    busy = running("b1", "b", 0, limit=None, start=NOW - 600)
    state = ClusterState(tree(), inventory(gpus=1), running=[busy])
    s = Scheduler.from_state(state)
    s.cycle(NOW)
    q = Quoter(s, forecast(state, NOW, probes={}), NOW)
    got = q.quote("ann", "a", "gpu:4", SliceRequest.whole(4), HOUR, NOW)
    assert got["predicted_start"] is None and got["starts_now"] is False
    assert got["why"] == "not within the forecast (the usage window)"


def test_offer_free_now_and_standings_of_the_last_cycle():
    state = ClusterState(tree(), inventory(gpus=2, mig=(1,)), policy=replace(
        Policy(), whole_gpu_on_mig=False), running=[running("r", "b", 0)],
        charges=[ChargeInterval("c", "b", "x", 1000, NOW - 10 * HOUR, NOW)])
    q = quoter(state)
    got = q.offer("ann", ["a", "b"], ["gpu:1", "mig:1g.10gb"], 2 * HOUR, NOW)
    assert set(got) == {"a", "b"} and set(got["a"]) == {"gpu:1", "mig:1g.10gb"}
    assert got["a"]["mig:1g.10gb"]["starts_now"] is True
    assert got["a"]["mig:1g.10gb"]["cost_gpu_hours"] == pytest.approx(2 * 143 / 1000)
    assert got["b"]["gpu:1"]["starts_now"] is False
    keys = ["gpu:1", "mig:1g.10gb", "mig:7g.80gb", "mps:250", "cpu"]
    # the share would start as a MIG instance (Policy.mps_on_mig)
    assert q.free_now(SliceRequest.whole(1), keys, NOW) == ["mig:1g.10gb", "mig:7g.80gb",
                                                            "mps:250"]
    assert q.free_now(SliceRequest.mig("1g.10gb"), keys, NOW) == ["mig:7g.80gb", "mps:250"]
    st = standings_of(q.sched, NOW)
    assert st["b"] == {"usage_hours": 10.0, "grant_hours": 100.0, "standing": 0.1}
    assert st["lab"]["grant_hours"] == 200.0
    fresh = Scheduler.from_state(state)  # no cycle yet: standings computed on demand
    assert standings_of(fresh, NOW - HOUR)["b"]["usage_hours"] == 9.0


# ---------------------------------------------------------------- the forecast


def test_the_forecast_steps_grow_with_the_distance_and_stop_at_the_horizon():
    # one GPU, a queue of 1-hour jobs: each starts when the one before ends
    pending = [job(f"q{i}", "a", at=i, limit=HOUR) for i in range(5)]
    fc = forecast(ClusterState(tree(), inventory(gpus=1), pending=pending), NOW)
    assert fc.starts == {f"q{i}": NOW + i * HOUR for i in range(5)}
    # a 3-hour horizon: what starts later is not forecast
    fc = forecast(ClusterState(tree(), inventory(gpus=1), pending=pending), NOW,
                  horizon=3 * HOUR)
    assert fc.starts == {f"q{i}": NOW + i * HOUR for i in range(4)}
    # far away, departures are taken in steps of a twentieth of the distance
    long = [job("long", "a", limit=100 * HOUR), job("next", "a", at=1, limit=HOUR)]
    fc = forecast(ClusterState(tree(), inventory(gpus=1), pending=long), NOW)
    assert fc.starts["next"] == NOW + 100 * HOUR
    # at most max_fills fills
    fc = forecast(ClusterState(tree(), inventory(gpus=1), pending=pending), NOW, max_fills=2)
    assert fc.starts == {f"q{i}": NOW + i * HOUR for i in range(3)}
    # probes: the first time a shape fits once the queue ahead is served
    fc = forecast(ClusterState(tree(), inventory(gpus=1), pending=pending), NOW,
                  probes={"gpu:1": SliceRequest.whole(1), "gpu:2": SliceRequest.whole(2)})
    assert fc.probe_starts == {"gpu:1": NOW + 5 * HOUR}


def test_the_forecast_counts_running_work_from_its_predicted_end():
    r = running("r", "b", 0, start=NOW - 2 * HOUR, limit=3 * HOUR)
    fc = forecast(ClusterState(tree(), inventory(gpus=1), running=[r],
                               pending=[job("w", "a", limit=HOUR)]), NOW)
    assert fc.starts == {"w": NOW + HOUR}
    # past its predicted end: half again as long as it has run (at least a minute)
    r = running("r", "b", 0, start=NOW - 2 * HOUR, limit=None)
    fc = forecast(ClusterState(tree(), inventory(gpus=1), running=[r],
                               pending=[job("w", "a", limit=HOUR)]), NOW)
    assert fc.starts == {"w": NOW + HOUR}
