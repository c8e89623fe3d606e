"""Job arrays and dependencies in the core (core/holds.py): properties over many cycles.

A small driver runs ``schedule(state, now)`` cycle after cycle, carries out its decisions
(starts, preemptions), ends running work after a drawn run time with a drawn outcome, and
checks after every cycle, from the running list alone: no array has more than its
``max_running`` tasks running, and no dependent job runs before its condition holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jupyter_gpubudget.core.holds import (
    AFTER_KINDS,
    NEVER,
    READY,
    WAIT,
    dependency,
    runnable,
    why_never,
    why_waiting,
)
from jupyter_gpubudget.core.model import Preempt, Start, Workload
from jupyter_gpubudget.core.scheduler import ClusterState, schedule

from .helpers import inventory, job, prop_settings, tree


def holds_condition(w: Workload, finished: dict[str, bool]) -> bool:
    """The condition, written out again from Slurm's definitions (not core/holds.py)."""
    ends = [finished[d] for d in w.after if d in finished]
    if len(ends) < len(w.after):
        return False
    if w.after_kind == "afterok":
        return all(ends)
    if w.after_kind == "afternotok":
        return not all(ends)
    return True


def drive(pending: list[Workload], runtimes: dict[str, float], fails: set[str],
          gpus: int, cycles: int = 60) -> tuple[dict[str, bool], list[str]]:
    """Run cycles every 60 s; return who ended how and the order of starts. Asserts the
    two properties after every cycle."""
    inv = inventory(nodes=1, gpus=gpus)
    accounts = tree()
    running: dict[str, Workload] = {}
    waiting = {w.id: w for w in pending}
    finished: dict[str, bool] = {}
    starts: list[str] = []
    caps = {w.array: w.array_max for w in pending if w.array is not None}
    for i in range(cycles):
        now = 60.0 * i
        for wid, w in list(running.items()):  # work that has run its time ends
            assert w.started_at is not None
            if now - w.started_at >= runtimes[wid]:
                del running[wid]
                finished[wid] = wid not in fails
        for wid, w in list(waiting.items()):  # what the service cancels: never startable
            if w.after and dependency(w.after, w.after_kind, finished) == NEVER:
                del waiting[wid]
                finished[wid] = False
        state = ClusterState(accounts, inv, running=list(running.values()),
                             pending=list(waiting.values()), finished=dict(finished))
        for d in schedule(state, now):
            if isinstance(d, Start):
                w = waiting.pop(d.workload)
                assert not w.after or holds_condition(w, finished), \
                    f"{w.id} started before its condition on {w.after} held"
                running[w.id] = replace(w, placement=d.placement, started_at=now,
                                        backed=d.backed, protected_until=d.protected_until)
                starts.append(w.id)
            elif isinstance(d, Preempt) and d.workload in running:
                w = running.pop(d.workload)
                waiting[w.id] = replace(w, placement=None, started_at=None, backed=False,
                                        protected_until=None)
        for arr, cap in caps.items():
            n = sum(1 for w in running.values() if w.array == arr)
            assert n <= cap, f"{n} tasks of {arr} run, max_running {cap}"
    return finished, starts


@given(n=st.integers(1, 25), cap=st.integers(1, 6), gpus=st.integers(1, 8),
       others=st.integers(0, 6), data=st.data())
@prop_settings(60)
def test_no_more_than_max_running_tasks_of_an_array_ever_run(n, cap, gpus, others, data):
    tasks = [replace(job(f"arr_{i}", "a", at=0.0), array="arr", array_max=cap)
             for i in range(n)]
    extra = [job(f"o{i}", data.draw(st.sampled_from(["a", "b"])), at=0.0)
             for i in range(others)]
    runtimes = {w.id: data.draw(st.sampled_from([60.0, 120.0, 300.0, 900.0]))
                for w in tasks + extra}
    finished, starts = drive(tasks + extra, runtimes, set(), gpus, cycles=40)
    # and the cap is a cap, not a stall: with GPUs enough, the tasks go through
    if gpus >= cap + others and 40 * 60 > (n // cap + 2) * 900:
        assert all(f"arr_{i}" in finished for i in range(n))


@given(kinds=st.lists(st.sampled_from(AFTER_KINDS), min_size=1, max_size=5),
       gpus=st.integers(1, 4), data=st.data())
@prop_settings(60)
def test_no_dependent_job_starts_before_its_condition_holds(kinds, gpus, data):
    base = [job(f"j{i}", "a", at=float(i)) for i in range(4)]
    deps = []
    for k, kind in enumerate(kinds):
        earlier = [w.id for w in base] + [w.id for w in deps]
        after = tuple(data.draw(st.lists(st.sampled_from(earlier), min_size=1, max_size=3,
                                         unique=True)))
        deps.append(replace(job(f"d{k}", data.draw(st.sampled_from(["a", "b"])), at=10.0 + k),
                            after=after, after_kind=kind))
    every = base + deps
    runtimes = {w.id: data.draw(st.sampled_from([60.0, 180.0, 600.0])) for w in every}
    fails = set(data.draw(st.lists(st.sampled_from([w.id for w in every]), unique=True)))
    finished, starts = drive(every, runtimes, fails, gpus, cycles=120)
    # and a dependent job is not a stall: each one either ran or was cancelled
    assert all(w.id in finished or w.id in starts for w in deps)


def test_an_array_runs_its_tasks_in_index_order_up_to_the_cap():
    tasks = [replace(job(f"t_{i}", "a"), array="t", array_max=3) for i in range(12)]
    out = runnable(tasks, [], {})
    assert [w.id for w in out] == ["t_0", "t_1", "t_2"]
    running = [replace(tasks[0], placement=None)]
    assert [w.id for w in runnable(tasks[1:], running, {})] == ["t_1", "t_2"]


def test_work_without_arrays_or_dependencies_is_passed_through_unchanged():
    pending = [job("x"), job("y")]
    assert runnable(pending, [], {}) is pending


@pytest.mark.parametrize("kind,finished,want", [
    ("afterok", {}, WAIT),
    ("afterok", {"a": True}, WAIT),
    ("afterok", {"a": False}, NEVER),
    ("afterok", {"a": True, "b": True}, READY),
    ("afterany", {"a": False, "b": True}, READY),
    ("afterany", {"a": False}, WAIT),
    ("afternotok", {"a": True, "b": True}, NEVER),
    ("afternotok", {"a": True, "b": False}, READY),
    ("afternotok", {"a": False}, WAIT),
])
def test_dependency_conditions_follow_slurm(kind, finished, want):
    assert dependency(("a", "b"), kind, finished) == want


def test_reasons_name_the_jobs():
    assert why_waiting(("train-7",), "afterok", {}) == "waiting for train-7 to succeed"
    assert "train-7 did not succeed" in why_never(("train-7",), "afterok", {"train-7": False})
