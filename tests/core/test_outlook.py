"""The preemption outlook (core/outlook.py): running work is told whether and about when the
scheduler's own cycle would preempt it, given the work queued now — at the end of its
protection, at once when it is unprotected already, on a drained node — and nothing is
foreseen where the cycle would preempt nothing."""

from jupyter_gpubudget.core.model import HOUR, ChargeInterval, Preempt
from jupyter_gpubudget.core.outlook import preemption_outlook, probe_times
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule

from .helpers import inventory, job, tree

NOW = 100 * HOUR


def charge(project: str, hours: float) -> ChargeInterval:
    return ChargeInterval(f"old-{project}", project, "x", 1000, NOW - hours * HOUR, NOW)


def running_state(*, protected_for: float, gpus: int = 1, pending=(), unhealthy=frozenset(),
                  b_used: float = 99.0, a_used: float = 0.0) -> ClusterState:
    """b's session runs on the one GPU, protected for ``protected_for`` seconds from NOW;
    of their 100 GPU-hours each, b has used ``b_used``, a ``a_used``."""
    s = Scheduler(tree(), inventory(gpus=gpus))
    started = NOW - 2 * HOUR
    s.submit(job("b-sess", "b", kind="interactive", resumable=True,
                 min_runtime=2 * HOUR + protected_for, limit=12 * HOUR, at=started), started)
    assert s.running["b-sess"].protected_until == NOW + protected_for
    return ClusterState(tree(), inventory(gpus=gpus), running=list(s.running.values()),
                        pending=list(pending),
                        charges=[charge("b", b_used), charge("a", a_used)],
                        unhealthy=frozenset(unhealthy))


def test_protected_session_is_foreseen_to_yield_when_its_protection_ends():
    state = running_state(protected_for=300, pending=[job("a1", "a", at=NOW - 60)])
    assert not [d for d in schedule(state, NOW) if isinstance(d, Preempt)]  # not yet
    out = preemption_outlook(state, NOW)
    assert set(out) == {"b-sess"}
    assert out["b-sess"].at == NOW + 300 and out["b-sess"].for_workload == "a1"
    assert "stands above a" in out["b-sess"].reason


def test_nothing_is_foreseen_without_queued_work_or_when_the_queue_would_not_take_it():
    assert preemption_outlook(running_state(protected_for=300), NOW) == {}
    # b stands below a: a's job waits; b's session is not preempted for it
    level = running_state(protected_for=300, b_used=1.0, a_used=90.0,
                          pending=[job("a1", "a", at=NOW - 60)])
    assert preemption_outlook(level, NOW) == {}
    # its protection outlasts the horizon: nothing within it
    long = running_state(protected_for=2 * HOUR, pending=[job("a1", "a", at=NOW - 60)])
    assert preemption_outlook(long, NOW, horizon=HOUR) == {}
    assert preemption_outlook(long, NOW, horizon=3 * HOUR)["b-sess"].at == NOW + 2 * HOUR


def test_outlook_now_is_the_cycles_own_preemption():
    """An unprotected session the cycle preempts now: the outlook says now, for the same
    work and in the same words as the cycle's decision."""
    state = running_state(protected_for=-60, pending=[job("a1", "a", at=NOW - 60)])
    (d,) = [d for d in schedule(state, NOW) if isinstance(d, Preempt)]
    out = preemption_outlook(state, NOW)
    assert out["b-sess"].at == NOW
    assert (out["b-sess"].for_workload, out["b-sess"].reason) == (d.for_workload, d.reason)


def test_one_queued_job_takes_one_session_not_every_one_that_ends_protection():
    """Two sessions of b end their protection at +5 and +10 min; one job of a is queued:
    the first session yields to it, the second has nothing left to yield to."""
    s = Scheduler(tree(), inventory(gpus=2))
    started = NOW - 2 * HOUR
    for wid, extra in (("b-first", 300), ("b-second", 600)):
        s.submit(job(wid, "b", kind="interactive", resumable=True,
                     min_runtime=2 * HOUR + extra, limit=12 * HOUR, at=started), started)
    state = ClusterState(tree(), inventory(gpus=2), running=list(s.running.values()),
                         pending=[job("a1", "a", at=NOW - 60)], charges=[charge("b", 99)])
    out = preemption_outlook(state, NOW)
    assert set(out) == {"b-first"} and out["b-first"].at == NOW + 300


def test_a_drained_node_foresees_its_protected_work_leaving_when_protection_ends():
    state = running_state(protected_for=600, unhealthy={"n0"})
    out = preemption_outlook(state, NOW)
    assert out["b-sess"].at == NOW + 600 and out["b-sess"].for_workload is None


def test_probe_times_are_now_the_protection_ends_within_the_horizon_and_its_end():
    state = running_state(protected_for=300)
    assert probe_times(state, NOW, HOUR, 10) == [NOW, NOW + 300, NOW + HOUR]
    assert probe_times(state, NOW, 60, 10) == [NOW, NOW + 60]
    assert probe_times(state, NOW, HOUR, 2) == [NOW, NOW + HOUR]


def test_the_state_is_not_touched():
    state = running_state(protected_for=300, pending=[job("a1", "a", at=NOW - 60)])
    before = (list(state.running), list(state.pending), list(state.charges))
    preemption_outlook(state, NOW)
    assert (list(state.running), list(state.pending), list(state.charges)) == before
