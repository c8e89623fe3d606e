"""A capacity model kept between cycles (core/kept.py, the service's cycle) decides exactly
what a cycle built from scratch decides (``schedule(state, now)``), over random sequences of
what happens between cycles: arrivals, completions, cancellations, nodes out of service and
back, the clock moving, grants changing, and the state read in another order."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core import cycle as cycle_mod
from jupyter_gpubudget.core import ranking
from jupyter_gpubudget.core.backing import Backing
from jupyter_gpubudget.core.kept import KeptCycle
from jupyter_gpubudget.core.model import (
    HOUR,
    Policy,
    Reserve,
    RuntimeHistory,
    SliceRequest,
    Workload,
)
from jupyter_gpubudget.core.ranking import RankMemo, compute_standings
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import THREE_PROJECTS, prop_settings, tree
from .plain_cycle import plain
from .test_forecast_fill import NOW, random_state, request

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import cycle as bench_cycle  # noqa: E402  (bench/cycle.py: the benchmark's state)

EVENTS = ("submit", "finish", "cancel", "node", "clock", "grants", "reorder", "learn")


def history(runs: list[tuple[str, str, float]]) -> RuntimeHistory:
    """The runs learnt so far, read afresh (as the service reads them every cycle)."""
    h = RuntimeHistory()
    for project, kind, seconds in runs:
        h.add("u", project, kind, seconds)
    return h


def step(state: ClusterState, after: Scheduler, events: list[str], rng: random.Random,
         now: float, k: int) -> tuple[ClusterState, float]:
    """The state the next cycle reads, as the service reads it from its ledger: ``after``
    (the scheduler after this cycle's decisions, as the service records them), then
    ``events`` (what finishes leaves its GPUs free for the next cycle)."""
    accounts, unhealthy, learnt = state.accounts, set(state.unhealthy), list(RUNS[id(state)])
    nodes = [n.name for n in state.inventory.nodes]
    running, pending = dict(after.running), dict(after.pending)
    charges = {(c.workload, c.start): c for c in after.meter.charges()}
    for i, ev in enumerate(events):
        now += rng.uniform(1, 120)
        if ev == "submit":
            for j in range(rng.randint(1, 6)):
                kind = rng.choice(["interactive", "batch", "debug"])
                w = Workload(f"k{k}-{i}-{j}", rng.choice(["p", "q", "r"]), "u", request(rng),
                             now, kind=kind, resumable=rng.random() < 0.5,
                             min_runtime=rng.choice([0, 1800]),
                             time_limit=rng.choice([None, HOUR]))
                pending[w.id] = w
        elif ev == "finish" and running:
            for wid in rng.sample(sorted(running), min(len(running), rng.randint(1, 8))):
                del running[wid]
                for key, c in list(charges.items()):
                    if c.workload == wid and c.end is None:
                        charges[key] = replace(c, end=now)
        elif ev == "cancel" and pending:
            for wid in rng.sample(sorted(pending), min(len(pending), rng.randint(1, 5))):
                del pending[wid]
        elif ev == "node":
            node = rng.choice(nodes)
            if node in unhealthy:
                unhealthy.discard(node)
            else:
                unhealthy.add(node)
        elif ev == "learn":  # a run ended: predictions of its kind change
            learnt.append((rng.choice(["p", "q", "r"]), rng.choice(["interactive", "batch",
                                                                    "debug"]),
                           rng.choice([60.0, 600.0, 3 * HOUR, 20 * HOUR])))
        elif ev == "clock":
            now += rng.uniform(0, 4 * HOUR)
        elif ev == "grants":
            accounts = tree(THREE_PROJECTS.format(
                g1=30000, gp=rng.choice([5000, 15000, 40000]), gq=15000,
                g2=rng.choice([10000, 30000]), gr=rng.choice([2000, 10000])))
    run, wait = list(running.values()), list(pending.values())
    if "reorder" in events:  # the ledger may read the same work in another order
        rng.shuffle(run)
        rng.shuffle(wait)
    new = ClusterState(accounts, state.inventory, state.policy, run, wait,
                       list(charges.values()), history=history(learnt),
                       unhealthy=frozenset(unhealthy))
    RUNS[id(new)] = learnt
    return new, now


#: the runs each state's history was read from (by the state's id)
RUNS: dict[int, list[tuple[str, str, float]]] = {}


def cycles_alike(seed: int, lease: bool, plan: list[list[str]]) -> None:
    rng = random.Random(seed)
    first = [(p, kind, rng.choice([300.0, 2 * HOUR, 9 * HOUR])) for p in "pqr"
             for kind in ("interactive", "batch", "debug")]
    state, now = replace(random_state(seed, lease), history=history(first)), NOW
    RUNS[id(state)] = first
    kept = KeptCycle()
    for k, events in enumerate(plan):
        with plain():  # the cycle from scratch, without its shortcuts (plain_cycle.py)
            scratch = Scheduler.from_state(state)
            want = scratch.cycle(now)
        sched, got, _lock = kept.cycle(state, now)
        assert got == want, f"cycle {k}: the kept model decided otherwise"
        assert sched.queue() == scratch.queue()
        state, now = step(state, scratch, events, rng, now, k)
    assert kept.reused >= len(plan) - 2  # every cycle but each model's first ran on it


@given(seed=st.integers(0, 10_000), lease=st.booleans(),
       plan=st.lists(st.lists(st.sampled_from(EVENTS), min_size=1, max_size=4),
                     min_size=3, max_size=6))
@prop_settings(20)
def test_a_kept_model_decides_as_a_cycle_from_scratch(seed, lease, plan):
    cycles_alike(seed, lease, plan)


#: fixed sequences (found by a search), each of which breaks a kept state that is not
#: brought to the next one: predictions kept after runs were learnt (3943); a kept model
#: whose orders are left as its history made them — the index buckets and each GPU's
#: tenants (3768), each node's free GPUs (7265), both the buckets and the free GPUs (538)
FIXED = [
    (3943, True, [["submit", "finish", "learn"], ["submit", "learn"],
                  ["reorder", "submit", "node", "learn"], ["cancel", "learn"]]),
    (3768, True, [["reorder"], ["grants"], ["cancel"], ["submit", "node", "grants", "node"],
                  ["submit"], ["finish"]]),
    (7265, True, [["reorder"], ["reorder", "node"], ["node"], ["finish", "node", "reorder"],
                  ["finish"], ["cancel", "reorder", "finish", "grants"]]),
    (538, False, [["node", "grants"], ["node", "node", "finish"], ["cancel", "reorder"],
                  ["cancel", "clock"], ["reorder", "reorder", "reorder"], ["cancel", "cancel"]]),
]


@pytest.mark.parametrize(("seed", "lease", "plan"), FIXED)
def test_fixed_sequences(seed, lease, plan):
    cycles_alike(seed, lease, plan)


def test_the_benchmarks_cycles_decide_as_the_plain_way_from_scratch():
    """On a scaled-down instance of the benchmark's state (bench/cycle.py): the full cluster
    (nothing fits: the idle pass stops early), a tenth of it freed with the first program's
    grant raised (backed work starts protected, preempts and reserves for gangs: the
    backing's memo is renewed by each promise), and back; the kept cycle decides as the
    plain cycle from scratch (plain_cycle.py) in each."""
    full = bench_cycle.build_state(2, nodes=32, queued=400)
    freed = bench_cycle.freed_tenth(full, 2)
    kept = KeptCycle()
    reserved = 0
    for state in (full, full, freed, freed, full, bench_cycle.freed_tenth(full, 2, 1)):
        with plain():
            want = Scheduler.from_state(state).cycle(bench_cycle.NOW)
        _s, got, _lock = kept.cycle(state, bench_cycle.NOW)
        assert got == want
        reserved += sum(isinstance(d, Reserve) for d in got)
    assert reserved > 0  # not vacuous: reservations move the times the memo keys read


def test_the_backing_memo_is_renewed_by_each_promise_and_release():
    """Backing keeps, per project, whether its grants are spent and which demands still fit
    (a cycle asks for each of thousands of queued workloads); a promise or a release changes
    the answer at once."""
    accounts = tree(THREE_PROJECTS.format(g1=30000, gp=15000, gq=15000, g2=10000, gr=10000))
    b = Backing(accounts, 1000.0, Policy())
    grants = b.grants()
    st_ = compute_standings(accounts, {"p": 0.0}, grants)
    b.st = st_
    room = min(grants[a] for a in accounts.path("p"))
    w = Workload("a", "p", "u", SliceRequest.whole(1), NOW, min_runtime=HOUR)
    need = Policy().effective_min_runtime(w) / HOUR
    assert b.backs(w, lambda: st_)
    gpu = SimpleNamespace(fraction=1.0)
    big = replace(w, id="big", backed=True, placement=gpu,
                  protected_until=NOW + (room - need / 2) * HOUR)
    b.promise(big, gpu, big.protected_until, NOW)
    assert not b.backs(w, lambda: st_)  # its demand no longer fits
    b.release(big, NOW)
    assert b.backs(w, lambda: st_)
    b.promise(big, gpu, NOW + (room + 1) * HOUR, NOW)
    assert b.spent("p", b.paths["p"], st_) and not b.backs(w, lambda: st_)


def test_nothing_fits_only_when_every_key_of_every_queued_shape_failed():
    shape = SliceRequest.whole(2).shape
    for lease, flags in ((0.0, (False,)), (1800.0, (False, True))):
        cyc = SimpleNamespace(failed=set(), res_times=[NOW + HOUR],
                              policy=Policy(backfill_lease=lease))
        keys = [(shape, i, f) for i in (0, 1) for f in flags]
        for k in keys:
            assert not cycle_mod.nothing_fits(cyc, [shape])
            cyc.failed.add(k)
        assert cycle_mod.nothing_fits(cyc, [shape])
        assert not cycle_mod.nothing_fits(cyc, [shape, SliceRequest.whole(1).shape])


@given(seed=st.integers(0, 10_000), steps=st.integers(2, 8))
@prop_settings(60)
def test_a_ranking_with_its_memo_orders_as_one_made_afresh(seed, steps):
    """``RankMemo`` over random changes between rankings — work queued and gone, an
    account's usage, a member's usage, a grant, a demand, the short lane — orders as
    ``rank`` without it."""
    rng = random.Random(seed)
    accounts = tree(THREE_PROJECTS.format(g1=30000, gp=15000, gq=15000, g2=10000, gr=10000))
    grants = accounts.effective_grants(10_000.0)
    usage = {p: rng.choice([0.0, 50.0, 400.0]) for p in "pqr"}
    members = {(p, u): rng.choice([0.0, 10.0]) for p in "pqr" for u in ("u1", "u2", "u3")}
    pending = [Workload(f"w{i}", rng.choice("pqrx"), rng.choice(["u1", "u2", "u3"]),
                        request(rng), NOW + i, kind=rng.choice(["interactive", "batch", "debug"]))
               for i in range(rng.randint(5, 40))]
    demand = {w.id: rng.choice([0.0, 1.0, 2.5]) for w in pending}
    lane = {w.id for w in pending if rng.random() < 0.2}
    memo = RankMemo()
    for k in range(steps):
        st_ = compute_standings(accounts, usage, grants, dict(members))
        args = (pending, accounts, st_, lambda w: demand[w.id], lambda w, ids=frozenset(lane): w.id in ids)
        got, want = ranking.rank(*args, memo=memo), ranking.rank(*args)
        assert [(key, w.id) for key, w in got] == [(key, w.id) for key, w in want]
        change = rng.choice(["add", "drop", "renew", "usage", "member", "grant", "demand",
                             "lane", ""])
        if change == "add":
            w = Workload(f"n{k}", rng.choice("pqr"), rng.choice(["u1", "u2"]), request(rng),
                         NOW + 100 + k, kind="batch")
            pending, demand[w.id] = [*pending, w], 1.0
        elif change == "drop" and pending:
            pending = [w for w in pending if w is not rng.choice(pending)]
        elif change == "renew" and pending:  # one gone and another come in its place
            i, pending = rng.randrange(len(pending)), list(pending)
            pending[i] = replace(pending[i], id=f"m{k}", submitted_at=NOW - k)
            demand[pending[i].id] = 1.0
        elif change == "usage":
            usage = {**usage, rng.choice("pqr"): rng.choice([0.0, 7.0, 900.0])}
        elif change == "member":
            members[(rng.choice("pqr"), rng.choice(["u1", "u2", "u3"]))] = rng.choice([0.0, 30.0])
        elif change == "grant":
            grants = {**grants, rng.choice(["prog1", "prog2", "p", "q", "r"]): rng.choice(
                [0.0, 100.0, 5000.0])}
        elif change == "demand" and pending:
            demand[rng.choice(pending).id] = rng.choice([0.0, 3.0])
        elif change == "lane" and pending:
            lane ^= {rng.choice(pending).id}
