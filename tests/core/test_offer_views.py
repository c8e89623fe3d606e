"""What the researcher's views ask of the core: which other slices would start now for a queued
workload (the queue page's hint, ``Quoter.free_now``), and GPU-hours per span (the sidebar's
daily chart)."""

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Policy,
    Preempt,
    SliceRequest,
    Start,
)
from jupyter_gpubudget.core.offer import Quoter, forecast
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule
from jupyter_gpubudget.core.usage import usage_by_span

from .helpers import inventory, job, tree

NOW = 100 * HOUR
OPTIONS = {"gpu:1": SliceRequest.whole(1), "gpu:2": SliceRequest.whole(2),
           "mig:1g.10gb": SliceRequest.mig("1g.10gb"), "mig:3g.40gb": SliceRequest.mig("3g.40gb"),
           "mps:500": SliceRequest.mps(500)}


def starts_now(state: ClusterState, wid: str, options: dict, now: float) -> list[str]:
    """The queue page's hint as the service computes it: after the cycle at ``now``, which
    other slices fit the capacity left free for the queued workload ``wid``."""
    own = next((w for w in state.pending if w.id == wid), None)
    if own is None:
        return []
    sched = Scheduler.from_state(state)
    sched.cycle(now)
    if wid not in sched.pending:  # it starts anyway
        return []
    q = Quoter(sched, forecast(state, now), now)
    keys = q.free_now(own.request, list(options), now)
    return [k for k in keys if k in options]


def _run(state: ClusterState) -> None:
    """Carry out one cycle's starts in the state (as the service would)."""
    for d in schedule(state, NOW):
        if isinstance(d, Start):
            w = next(p for p in state.pending if p.id == d.workload)
            w.started_at, w.placement, w.backed = NOW, d.placement, d.backed
            w.protected_until = d.protected_until
            state.pending.remove(w)
            state.running = [*state.running, w]


def test_a_queued_whole_gpu_request_learns_that_mig_slices_are_free():
    # GPU 0 whole (taken by a protected job), GPU 1 MIG-partitioned and empty (and kept for
    # MIG slices: a one-GPU request may not take it whole as a 7g instance here)
    state = ClusterState(tree(), inventory(gpus=2, mig=(1,)),
                         policy=replace(Policy(), whole_gpu_on_mig=False),
                         pending=[job("hold", "b", min_runtime=10 * HOUR, kind="interactive")])
    _run(state)
    assert [w.id for w in state.running] == ["hold"]
    state.pending = [job("want", "a", kind="interactive", min_runtime=HOUR)]
    # (an MPS share too: with no GPU outside MIG mode free it would start as a MIG instance)
    assert starts_now(state, "want", OPTIONS, NOW) == ["mig:1g.10gb", "mig:3g.40gb", "mps:500"]
    state.policy = replace(state.policy, mps_on_mig=False)
    assert starts_now(state, "want", OPTIONS, NOW) == ["mig:1g.10gb", "mig:3g.40gb"]
    assert [w.id for w in state.pending] == ["want"]  # nothing kept
    assert state.pending[0].request == SliceRequest.whole(1)
    assert starts_now(state, "nobody", OPTIONS, NOW) == []


def test_the_workloads_own_request_and_what_only_preemption_would_free_are_not_offered():
    # one whole GPU held by an unbacked job (project c has no grant): a backed request
    # would preempt it, which is not "free now"
    text = """
accounts:
  lab:
    grant: 200
    children:
      a: {grant: 100, members: [ann]}
      c: {grant: 0, members: [cat]}
"""
    state = ClusterState(tree(text), inventory(gpus=1), pending=[job("cheap", "c")])
    _run(state)
    assert not state.running[0].backed
    state.pending = [job("want", "a", min_runtime=HOUR)]
    # its own request (gpu:1) is skipped; an MPS share would fit only by preempting
    assert starts_now(state, "want", OPTIONS, NOW) == []
    preempts = [d for d in schedule(state, NOW) if isinstance(d, Preempt)]
    assert [(d.workload, d.for_workload) for d in preempts] == [("cheap", "want")]


def test_queue_order_is_respected():
    # two whole GPUs free but a gang of 2 ahead in the queue holds a reservation on them:
    # a 1-GPU alternative for the second in line only counts if it would really start
    state = ClusterState(tree(), inventory(gpus=2),
                         pending=[job("first", "a", gpus=2, at=0),
                                  job("second", "b", req=SliceRequest.mig("1g.10gb"), at=1)])
    # no MIG here: the alternatives are whole GPUs; the gang takes both, nothing is left
    assert starts_now(state, "second", {"gpu:1": SliceRequest.whole(1)}, NOW) == []


def _overlap(c: ChargeInterval, lo: float, hi: float, now: float) -> float:
    end = min(now, c.end if c.end is not None else now)
    return max(0.0, min(end, hi) - max(c.start, lo)) * c.milli / 1000 / HOUR


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(0, 30), st.integers(0, 8000),
                          st.booleans()), max_size=30),
       st.lists(st.floats(0.5, 12), min_size=1, max_size=10))
def test_usage_by_span_is_the_overlap_of_each_interval_with_each_span(raw, widths):
    now = 60 * HOUR
    charges = [ChargeInterval(f"w{i}", "a", "u", milli, s * HOUR,
                              None if open_ else (s + d) * HOUR)
               for i, (s, d, milli, open_) in enumerate(raw)]
    spans, t = [], 5 * HOUR
    for w in widths:
        spans.append((t, t + w * HOUR))
        t += w * HOUR
    got = usage_by_span(charges, spans, now)
    want = [sum(_overlap(c, lo, hi, now) for c in charges) for lo, hi in spans]
    assert len(got) == len(spans)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) < 1e-9


def test_usage_by_span_counts_an_open_interval_up_to_now():
    c = ChargeInterval("w", "a", "u", 500, 10 * HOUR, None)
    assert usage_by_span([c], [(0, 12 * HOUR), (12 * HOUR, 24 * HOUR)], 14 * HOUR) == \
        [1.0, 1.0]
