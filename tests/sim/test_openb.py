"""openb placement reproduction on small node and pod lists."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.sim import openb
from jupyter_gpubudget.sim.traces import OpenbNode, OpenbPod

NODES = [OpenbNode(f"n{i}", 32000, 131072, 4 if i % 2 else 2, "T4") for i in range(12)]
PODS = ([OpenbPod(f"s{i}", 4000, 8192, 1, m) for i, m in enumerate([250, 500, 460, 700] * 6)]
        + [OpenbPod(f"w{i}", 8000, 16384, 1, 1000) for i in range(10)]
        + [OpenbPod(f"g{i}", 16000, 16384, 2, 1000) for i in range(3)]
        + [OpenbPod(f"c{i}", 6000, 8192, 0, 0) for i in range(4)])
CAP = 1000 * sum(n.gpus for n in NODES)


def test_sampling_reaches_the_ratio_and_is_seeded() -> None:
    a = openb.sample_pods(PODS, CAP, 1.3, seed=1)
    b = openb.sample_pods(PODS, CAP, 1.3, seed=1)
    c = openb.sample_pods(PODS, CAP, 1.3, seed=2)
    assert [p.name for p in a] == [p.name for p in b] != [p.name for p in c]
    req = sum(p.gpu_request_milli for p in a)
    assert req >= 1.3 * CAP
    assert req - a[-1].gpu_request_milli < 1.3 * CAP  # the last pod crosses the line


def test_bestfit_by_hand() -> None:
    nodes = [OpenbNode("a", 8000, 10**6, 2, "T4"), OpenbNode("b", 64000, 10**6, 2, "T4")]
    pods = [OpenbPod("p1", 4000, 1, 1, 500),  # tighter CPU: node a, GPU 0
            OpenbPod("p2", 4000, 1, 1, 500),  # a again (same GPU is fullest that fits)
            OpenbPod("p3", 1000, 1, 1, 1000),  # a has no CPU left: node b
            OpenbPod("p4", 1000, 1, 2, 1000)]  # nobody has two free GPUs: fails
    run = openb.run_bestfit(nodes, pods)
    assert (run.placed, run.failed) == (3, 1)
    assert run.allocated_milli == 2000 and run.alloc_pct == pytest.approx(50.0)


@pytest.mark.parametrize("policy", ["bestfit", "fgd-index", "default"])
def test_policies_never_overcommit(policy: str) -> None:
    sample = openb.sample_pods(PODS, CAP, 1.3, seed=0)
    run = openb.POLICIES[policy](NODES, sample, 0)
    assert 0 < run.allocated_milli <= CAP
    assert run.placed + run.failed == len(sample)
    assert run.curve  # read along the way
    assert 50.0 < run.alloc_pct <= 100.0


def test_default_is_deterministic() -> None:
    sample = openb.sample_pods(PODS, CAP, 1.3, seed=3)
    a = openb.run_default(NODES, sample, 3)
    b = openb.run_default(NODES, sample, 3)
    assert a.to_dict() == b.to_dict()


def test_shared_openb_lists_load(shared_traces) -> None:  # type: ignore[no-untyped-def]
    from jupyter_gpubudget.sim.traces import load_openb_nodes, load_openb_pods

    nodes = load_openb_nodes(shared_traces / "openb" / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(shared_traces / "openb" / "openb_pod_list_default.csv")
    assert len(nodes) == 1213 and sum(n.gpus for n in nodes) == 6212
    assert len(pods) == 8152


def test_openb_reproduction_seed0(shared_traces) -> None:  # type: ignore[no-untyped-def]
    """The FGD-paper setting on the real lists, one seed (bench/openb.py runs ten)."""
    from jupyter_gpubudget.sim.traces import load_openb_nodes, load_openb_pods

    nodes = load_openb_nodes(shared_traces / "openb" / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(shared_traces / "openb" / "openb_pod_list_default.csv")
    sample = openb.sample_pods(pods, 1000 * sum(n.gpus for n in nodes), 1.3, seed=0)
    best = openb.run_bestfit(nodes, sample, 0)
    assert abs(best.alloc_pct - 93.08) <= 1.5  # published BestFit 93.08 ± 0.13
    default = openb.run_default(nodes, sample, 0)
    assert default.alloc_pct >= 95.0  # published FGD 95.39 ± 0.08
    assert default.alloc_pct > best.alloc_pct + 1.5
