"""The max-min entitled share the simulator's report compares delivered shares with
(sim/metrics.py ``entitled_shares``): a program that asked for less than its grant's part of
what was delivered is entitled to all it asked for, and what it leaves is shared by grant."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.sim import metrics
from jupyter_gpubudget.sim.engine import SimConfig, simulate
from jupyter_gpubudget.sim.metrics import entitled_shares
from jupyter_gpubudget.sim.traces import parse_native


def programs(**figures: tuple[float, float]) -> dict[str, dict]:
    """name=(grant share, delivered GPU-hours)"""
    return {n: {"grant_share": g, "delivered_gpu_hours": d} for n, (g, d) in figures.items()}


def test_everyone_asking_for_more_than_their_part_is_entitled_to_the_grant_share():
    sibs = programs(physics=(0.5, 500.0), biology=(0.3, 300.0), ml=(0.2, 200.0))
    got = entitled_shares(sibs, {"physics": 9e9, "biology": 9e9, "ml": 9e9})
    assert got == pytest.approx({"physics": 0.5, "biology": 0.3, "ml": 0.2})


def test_a_program_that_asked_for_less_gets_what_it_asked_for_and_the_rest_goes_by_grant():
    # 1000 GPU-h delivered; ml asked for 100 (its part would be 200): physics and biology
    # share the other 900 as 5:3
    sibs = programs(physics=(0.5, 560.0), biology=(0.3, 340.0), ml=(0.2, 100.0))
    got = entitled_shares(sibs, {"physics": 5000.0, "biology": 5000.0, "ml": 100.0})
    assert got == pytest.approx({"physics": 0.5625, "biology": 0.3375, "ml": 0.1})
    # water-filling goes on: biology, asked for 300, is capped in the second round
    got = entitled_shares(sibs, {"physics": 5000.0, "biology": 300.0, "ml": 100.0})
    assert got == pytest.approx({"physics": 0.6, "biology": 0.3, "ml": 0.1})


def test_nothing_delivered_falls_back_to_grant_shares():
    sibs = programs(a=(0.6, 0.0), b=(0.4, 0.0))
    assert entitled_shares(sibs, {}) == {"a": 0.6, "b": 0.4}


def test_the_report_says_what_no_scheduler_can_beat_when_a_program_asks_for_little() -> None:
    """Equal grants; a asks for 4 GPU-hours, b for 1, and both get all of it: b's share is
    20 % against a 50 % grant. The grant error (30 pt) is all the fair split's own (its
    floor), none of it the scheduler's (0 pt from entitled shares)."""
    budgets = load_budgets("accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n", "b.yaml")
    trace = parse_native(
        "id,submit,duration,gpus,project,user,kind,min_runtime,resumable\n"
        "a1,0,2h,1,a,ann,batch,0,true\n"
        "a2,0,2h,1,a,ann,batch,0,true\n"
        "b1,2h,1h,1,b,bob,batch,0,true\n", "little.csv")
    inv = Inventory((make_node("n0", "H100-80GB", 2),))
    m = metrics.compute(simulate(trace, budgets.accounts, inv, budgets.policy,
                                 SimConfig(cycle_interval=60)))
    assert m["share_error_pts"] == pytest.approx(30.0, abs=0.01)
    assert m["entitled_share_error_pts"] == pytest.approx(0.0, abs=0.01)
    assert m["share_error_floor_pts"] == pytest.approx(30.0, abs=0.01)
