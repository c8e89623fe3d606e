"""The simulator's interconnect model (sim/interconnect.py): a gang on poorer
links than the best for its size progresses more slowly, its run lasts longer, and only the
held GPU-hours times its rate are useful."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.capacity import Cluster
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, Placement, Policy, SliceAlloc, SliceRequest
from jupyter_gpubudget.sim import metrics
from jupyter_gpubudget.sim.engine import SimConfig, simulate
from jupyter_gpubudget.sim.interconnect import BUS_GBPS, progress_rate, slowest_link
from jupyter_gpubudget.sim.traces import Trace, TraceJob

H100 = "H100-80GB"


def gpus(node: str, *idx: int, mig: bool = False) -> list[SliceAlloc]:
    if mig:
        return [SliceAlloc(node, i, "mig", 1000, 0, "7g.80gb") for i in idx]
    return [SliceAlloc(node, i) for i in idx]


def test_the_slowest_link_sets_the_rate():
    c = Cluster(Inventory((make_node("n0", H100, 8, nvlink=((0, 1, 2, 3), (4, 5, 6, 7))),
                           make_node("n1", H100, 8), make_node("m", H100, 4, mig=(0, 1, 2, 3)))))
    one_domain = Placement(tuple(gpus("n0", 0, 1, 2, 3)))
    two_domains = Placement(tuple(gpus("n0", 0, 1, 4, 5)))
    two_nodes = Placement(tuple(gpus("n0", 0, 1) + gpus("n1", 0, 1)))
    on_mig = Placement(tuple(gpus("m", 0, 1, 2, 3, mig=True)))
    assert [slowest_link(c, p) for p in (one_domain, two_domains, two_nodes, on_mig)] == [
        "nvlink", "pcie", "network", "host"]
    assert progress_rate(c, one_domain) == 1.0
    # 4 ranks could share a domain: (1 - 0.1) + 0.1 * 470 / 20 = 3.25 times as long on MIG
    assert progress_rate(c, on_mig) == pytest.approx(1 / (0.9 + 0.1 * 470 / 20))
    assert progress_rate(c, two_domains) == pytest.approx(1 / (0.9 + 0.1 * 470 / 40))
    assert progress_rate(c, on_mig, comm=0.0) == 1.0
    # 12 ranks span nodes whatever they get: the network is their best; MIG costs 45 / 20
    big = Placement(tuple(gpus("n1", *range(8)) + gpus("m", 0, 1, 2, 3, mig=True)))
    assert progress_rate(c, big) == pytest.approx(
        1 / (0.9 + 0.1 * BUS_GBPS["network"] / BUS_GBPS["host"]))
    assert progress_rate(c, Placement(tuple(gpus("n1", *range(8)) + gpus("n0", 0, 1, 2, 3)))) \
        == 1.0
    assert progress_rate(c, Placement(tuple(gpus("m", 0, mig=True)))) == 1.0  # one rank


def test_a_gang_on_mig_instances_runs_longer_and_delivers_less_useful_work():
    # one MIG-mode node of 4 GPUs and nothing else: a 4-GPU gang that declared ``any`` runs
    # there as 7g instances with gang_on_mig and no spare
    inv = Inventory((make_node("m", H100, 4, mig=(0, 1, 2, 3)),
                     make_node("n", H100, 2)))
    budgets = load_budgets("accounts: {p: {grant: 1000}}\n")
    policy = Policy(gang_on_mig=True, gang_on_mig_spare=0)
    job = TraceJob("g", 0.0, HOUR, SliceRequest.whole(4, interconnect="any"), "p", "u")
    res = simulate(Trace((job,), "test", "native"), budgets.accounts, inv, policy, SimConfig())
    r = res.records["g"]
    # outside MIG mode no node holds 4 GPUs, so its best links were the network's
    rate = 1 / (0.9 + 0.1 * 45 / 20)
    assert r.end == pytest.approx(HOUR / rate)
    assert r.gpu_hours == pytest.approx(4 * HOUR / rate / HOUR)
    assert r.useful_gpu_hours == pytest.approx(4.0)
    m = metrics.compute(res)
    assert m["useful_gpu_hours"] == pytest.approx(4.0)
    assert m["utilisation"] == pytest.approx(m["held_utilisation"] * rate)
    # without the cost model the same run takes its hour
    res0 = simulate(Trace((job,), "test", "native"), budgets.accounts, inv, policy,
                    SimConfig(comm_fraction=0.0))
    assert res0.records["g"].end == pytest.approx(HOUR)


def test_a_native_trace_declares_a_gangs_interconnect():
    from jupyter_gpubudget.sim.traces import TraceError, parse_native

    t = parse_native("submit,duration,gpus,interconnect\n0,1h,4,any\n0,1h,2,\n", "t.csv")
    assert [j.request.interconnect for j in t.jobs] == ["any", None]
    with pytest.raises(TraceError, match="interconnect"):
        parse_native("submit,duration,slice,interconnect\n0,1h,mig:1g.10gb,any\n", "t.csv")
