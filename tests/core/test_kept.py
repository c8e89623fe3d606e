"""A capacity model kept between cycles (core/kept.py, the service's cycle) decides exactly
what a cycle built from scratch decides (``schedule(state, now)``), over random sequences of
what happens between cycles: arrivals, completions, cancellations, nodes out of service and
back, the clock moving, grants changing, and the state read in another order."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.kept import KeptCycle
from jupyter_gpubudget.core.model import HOUR, RuntimeHistory, Workload
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import THREE_PROJECTS, prop_settings, tree
from .test_forecast_fill import NOW, random_state, request

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
