"""The fill pass (``Scheduler._fill_pass``: start what fits, in rank order, after a departure)
runs after every departure, so its loop is written for speed: the queue entry and the "does
not fit" memo are worked out inline. This property replays random queues through a cycle of
departures with the fill pass written plainly (the reference below, through
``WorkQueue.current`` and ``memo_key``) and with the fast one, and requires the same
decisions. The forecast's own fill (``core/forecast.py``) is held to this reference in
``test_forecast_replay.py``."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.cycle import memo_key
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, ChargeInterval, Policy, SliceRequest, Workload
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

from .helpers import THREE_PROJECTS, prop_settings, tree

NOW = 30 * 24 * HOUR


def reference_fill_pass(self: Scheduler, now: float, out: list) -> bool:
    """The fill pass as it was written before its loop was inlined."""
    res_times = sorted({at for at, _ in self.reservations.values()}
                       | ({self.lane.until} if self.lane.held else set()))
    failed: set[tuple[object, ...]] = set()
    q = self.waiting
    for _, seq, wid in list(q.order):
        if not res_times and len(failed) >= len(q.shape_count):
            break
        w = q.current(wid, seq)
        if w is None:
            continue
        end = now + self.predict_long(w)
        memo = memo_key(w, end, res_times, self.policy)
        own = wid in self.reservations
        if memo in failed and not own:
            continue
        p = self._place(w, end, now)
        if p is None:
            failed.add(memo)
            continue
        self._start(w, p, self.is_backed(w, now), now, out)
        if own:
            return True
    return False


@contextmanager
def plain_fill() -> Iterator[None]:
    """Scheduler._fill_pass replaced by the reference while the block runs."""
    fast = Scheduler._fill_pass
    Scheduler._fill_pass = reference_fill_pass  # type: ignore[method-assign]
    try:
        yield
    finally:
        Scheduler._fill_pass = fast  # type: ignore[method-assign]


def request(rng: random.Random) -> SliceRequest:
    r = rng.random()
    if r < 0.2:
        return SliceRequest.whole(1)
    if r < 0.5:
        return SliceRequest.whole(rng.choice([2, 4, 8, 16]))
    if r < 0.8:
        return SliceRequest.mig(rng.choice(["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]))
    return SliceRequest.mps(rng.choice([250, 500]))


def random_state(seed: int, lease: bool) -> ClusterState:
    """A queue built the way the service builds it (arrivals on the incremental path, a
    full cycle now and then), on 12 nodes of 8 GPUs, two of them in MIG mode."""
    rng = random.Random(seed)
    grants = dict(g1=30000, gp=15000, gq=15000, g2=rng.choice([10000, 30000]), gr=10000)
    accounts = tree(THREE_PROJECTS.format(**grants))
    inv = Inventory(tuple(make_node(f"n{i}", "H100-80GB", 8, mig=(6, 7), rack=f"r{i // 4}")
                          for i in range(12)))
    policy = Policy(backfill_lease=1800.0 if lease else 0.0)
    s = Scheduler(accounts, inv, policy)
    t = NOW - 6 * HOUR
    for i in range(rng.randint(60, 160)):
        t += rng.uniform(5, 120)
        kind = rng.choice(["interactive", "batch", "batch", "debug"])
        s.submit(Workload(f"w{i}", rng.choice(["p", "q", "r"]), "u", request(rng), t,
                          kind=kind, resumable=rng.random() < 0.5,
                          min_runtime=rng.choice([0, 1800, 2 * HOUR]),
                          time_limit=rng.choice([None, HOUR, 12 * HOUR])), t)
        if i % 40 == 39:
            s.cycle(t)
    charges = list(s.meter.charges())
    charges += [ChargeInterval(f"old{k}", rng.choice(["p", "q", "r"]), "u", 1000,
                               NOW - 40 * HOUR, NOW - rng.uniform(1, 30) * HOUR)
                for k in range(5)]
    return ClusterState(accounts, inv, policy, list(s.running.values()),
                        list(s.pending.values()), charges)


@given(seed=st.integers(0, 10_000), lease=st.booleans())
@prop_settings(25)
def test_departures_fill_alike_with_the_fast_and_the_plain_pass(seed, lease):
    state = random_state(seed, lease)
    rng = random.Random(seed)

    def replay() -> list:
        s = Scheduler.from_state(state)
        out = list(s.cycle(NOW))
        gone = sorted(s.running)
        rng.seed(seed)
        rng.shuffle(gone)
        for k, wid in enumerate(gone[:12]):
            out += s.finish(wid, NOW + 60 * (k + 1))
        return out

    fast = replay()
    with plain_fill():
        plain = replay()
    assert fast == plain
