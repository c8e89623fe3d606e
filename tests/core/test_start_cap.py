"""policy.max_starts_per_cycle: a cycle decides at most that many Starts (0: no cap); the
rest waits for the next cycle, which goes on in the same rank order."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jupyter_gpubudget.core.accounts import BudgetError, load_budgets
from jupyter_gpubudget.core.model import HOUR, ChargeInterval, Policy, Start
from jupyter_gpubudget.core.scheduler import ClusterState, schedule

from .helpers import TWO_PROJECTS, inventory, job, tree

NOW = 100 * HOUR


def starts(decisions: list) -> list[str]:
    return [d.workload for d in decisions if isinstance(d, Start)]


def _state(policy: Policy, charges: tuple = ()) -> ClusterState:
    # 16 GPUs, 10 one-GPU jobs of both projects: all fit at once
    pending = [job(f"{p}{i}", p, at=i) for i in range(5) for p in "ab"]
    return ClusterState(tree(), inventory(nodes=2, gpus=8), pending=pending,
                        charges=list(charges), policy=policy)


@pytest.mark.parametrize("charges", [(), (ChargeInterval("old", "b", "x", 1000, 0, 150 * HOUR),)],
                         ids=["backed", "b-unbacked"])
def test_a_capped_cycle_starts_the_first_of_what_an_uncapped_one_would(charges):
    # (b over its grant: its jobs start unbacked, in the pass over idle capacity)
    free = starts(schedule(_state(Policy(), charges), NOW))
    assert len(free) == 10
    state = _state(Policy(max_starts_per_cycle=3), charges)
    done: list[str] = []
    for _ in range(4):
        got = starts(schedule(state, NOW))
        assert len(got) == min(3, 10 - len(done))
        done += got
        started = [replace(w, started_at=NOW, placement=next(
            d.placement for d in schedule(state, NOW) if getattr(d, "workload", None) == w.id))
            for w in state.pending if w.id in got]
        state = replace(state, pending=[w for w in state.pending if w.id not in got],
                        running=[*state.running, *started])
    assert done == free  # the same Starts, in the same order, three per cycle


def test_no_cap_by_default_and_the_key_is_read_and_checked():
    assert Policy().max_starts_per_cycle == 0
    b = load_budgets(TWO_PROJECTS + "policy: {max_starts_per_cycle: 64}\n", "b.yaml")
    assert b.policy.max_starts_per_cycle == 64
    for bad in ("-1", "2.5", "many"):
        with pytest.raises(BudgetError, match="max_starts_per_cycle"):
            load_budgets(TWO_PROJECTS + f"policy: {{max_starts_per_cycle: {bad}}}\n", "b.yaml")
