"""The core's answers for the operator's pages: why work waits, what a grant change would do,
shares of the parent, and the drain of an unhealthy node (unprotected work leaves at once,
protected work keeps its time)."""

from __future__ import annotations

from jupyter_gpubudget.core.explain import describe_request, why_waiting
from jupyter_gpubudget.core.model import HOUR, ChargeInterval, Drain, Preempt, SliceRequest, Start
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler, schedule
from jupyter_gpubudget.core.whatif import grant_preview, sibling_shares, standings

from .helpers import inventory, job, tree

NOW = 10 * HOUR

SMALL = """
accounts:
  lab:
    grant: 200
    children:
      a: {grant: 100, members: [ann]}
      b: {grant: 1, members: [ben]}
"""


def running(wid, project, node, gpu, *, start=NOW - 60, protected_until=None, backed=True):  # noqa: ANN001, ANN201
    from jupyter_gpubudget.core.model import Placement, SliceAlloc

    w = job(wid, project)
    w.started_at, w.backed, w.protected_until = start, backed, protected_until
    w.placement = Placement((SliceAlloc(node, gpu),))
    return w


def test_describe_request():
    assert describe_request(SliceRequest.whole(2)) == "2 whole GPUs"
    assert describe_request(SliceRequest.whole(1)) == "1 whole GPU"
    assert describe_request(SliceRequest.mig("1g.10gb")) == "MIG 1g.10gb"
    assert describe_request(SliceRequest.mps(250)) == "an MPS share of 25% of a GPU"
    assert describe_request(SliceRequest.cpu_only()) == "CPU only"


def test_why_waiting_capacity_unbacked_unknown_and_draining():
    inv = inventory(nodes=2, gpus=1)
    # both GPUs held by protected backed work of project a
    run = [running("r0", "a", "n0", 0, protected_until=NOW + HOUR),
           running("r1", "a", "n1", 0, protected_until=NOW + HOUR)]
    pend = [job("cap", "a", at=1.0),  # backed, blocked by capacity
            job("unb", "b", at=2.0, min_runtime=5 * HOUR),  # b's grant (1 h) cannot cover 5 h
            job("ghost", "nowhere", at=3.0),
            job("big", "a", gpus=2, at=4.0)]
    charges = [ChargeInterval("old", "b", "ben", 1000, NOW - 2 * HOUR, NOW - HOUR)]
    st = ClusterState(tree(SMALL), inv, running=run, pending=pend, charges=charges)
    w = why_waiting(st, NOW)
    assert w["cap"].reason == "capacity" and w["cap"].backed
    assert "1 whole GPU" in w["cap"].message
    assert w["unb"].reason == "unbacked" and not w["unb"].backed
    assert "'b'" in w["unb"].message and "idle" in w["unb"].message
    assert w["ghost"].reason == "unknown-project"
    assert w["big"].reason in ("capacity", "reserved")  # a gang: reserved as work ends
    # the state is untouched
    assert [x.id for x in st.pending] == ["cap", "unb", "ghost", "big"]
    # a node out of service: a 2-GPU single-node request can only go there
    inv2 = inventory(nodes=2, gpus=2)
    one = ClusterState(tree(SMALL), inv2, pending=[job("pair", "a", gpus=2)],
                       unhealthy=frozenset({"n0", "n1"}))
    assert why_waiting(one, NOW)["pair"].reason == "draining"
    free = ClusterState(tree(SMALL), inv2, pending=[job("go", "a")])
    assert why_waiting(free, NOW)["go"].reason == "starts"


def test_why_waiting_blocked_by_a_reservation():
    """A gang of 2 waits for n0's GPU (held by work ending in 1 h): that GPU is reserved for
    it; a long 1-GPU job that would not end before then is blocked by the reservation."""
    inv = inventory(nodes=1, gpus=2)
    run = [running("r0", "a", "n0", 0, protected_until=NOW + 10 * HOUR)]
    gang = job("gang", "a", gpus=2, at=1.0, limit=HOUR)
    long = job("long", "a", gpus=1, at=2.0, limit=20 * HOUR)
    st = ClusterState(tree(), inv, running=run, pending=[gang, long])
    w = why_waiting(st, NOW)
    assert w["gang"].reason == "reserved" and w["gang"].at is not None
    assert w["long"].reason == "reservation" and w["long"].blocker == "gang"
    # and the core really does not start it
    assert not [d for d in schedule(st, NOW) if isinstance(d, Start)]


def test_grant_preview_changes_standing_and_backing():
    inv = inventory(nodes=1, gpus=4)
    charges = [ChargeInterval("x", "b", "ben", 1000, NOW - 3 * HOUR, NOW - HOUR)]  # 2 GPU-h
    pend = [job("p", "b", at=1.0, min_runtime=2 * HOUR)]
    st = ClusterState(tree(SMALL), inv, pending=pend, charges=charges)
    before = standings(st, NOW)
    out = grant_preview(st, NOW, "b", 10.0, None)
    b = out["accounts"]["b"]
    assert b["grant_before"] == 1.0 and b["grant_after"] == 10.0
    assert abs(b["standing_before"] - before["b"]["standing"]) < 1e-9
    assert abs(b["standing_before"] - 2.0) < 1e-6 and abs(b["standing_after"] - 0.2) < 1e-6
    assert out["backing"] == [{"workload": "p", "project": "b", "user": "u",
                               "backed_before": False, "backed_after": True}]
    # a's grant and standing stay; its share of lab's grants shrinks (100/101 -> 100/110)
    a = out["accounts"]["a"]
    assert a["grant_before"] == a["grant_after"] == 100.0
    assert a["standing_before"] == a["standing_after"]
    assert abs(a["share_before"] - 100 / 101) < 1e-9 and abs(a["share_after"] - 100 / 110) < 1e-9
    assert abs(b["share_after"] - 10 / 110) < 1e-9
    assert "lab" not in out["accounts"]  # nothing of lab's changes
    assert out["before"] == {"grant_hours": 1.0, "share_pct": None}
    # nothing changed in the state itself
    assert st.accounts.get("b").grant_hours == 1.0


def test_sibling_shares():
    t = tree(SMALL)
    figs = {"lab": {"grant_hours": 200, "usage_hours": 10},
            "a": {"grant_hours": 100, "usage_hours": 3}, "b": {"grant_hours": 1, "usage_hours": 1}}
    sh = sibling_shares(t, figs)
    assert abs(sh["a"]["grant_share"] - 100 / 101) < 1e-9
    assert abs(sh["a"]["delivered_share"] - 0.75) < 1e-9
    assert sh["lab"] == {"grant_share": 1.0, "delivered_share": 1.0}
    none = sibling_shares(t, {})
    assert none["a"] == {"grant_share": None, "delivered_share": None}


def test_drain_preempts_unprotected_at_once_and_protected_at_its_end():
    inv = inventory(nodes=2, gpus=2)
    s = Scheduler(tree(), inv)
    s.submit(job("prot", "a", min_runtime=2 * HOUR, kind="interactive"), NOW)
    s.submit(job("free", "a", resumable=True), NOW)
    s.submit(job("elsewhere", "b"), NOW)
    nodes = {wid: w.placement.nodes[0] for wid, w in s.running.items()}
    bad = nodes["prot"]
    assert nodes["free"] == bad  # packed on one node (best fit)
    s.set_healthy(bad, False)
    ds = s.cycle(NOW + 60)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["free"]
    assert not [d for d in ds if isinstance(d, Drain)]  # protected work still there
    assert "prot" in s.running
    # nothing new lands on it
    new = s.submit(job("new", "a"), NOW + 120)
    assert all(bad not in d.placement.nodes for d in new if isinstance(d, Start))
    # at its protected-until, the protected one goes too, and the node is drained
    ds = s.cycle(NOW + 2 * HOUR + 1)
    assert [d.workload for d in ds if isinstance(d, Preempt)] == ["prot"]
    assert Drain(bad) in ds


def test_grant_preview_by_hand_with_shares_and_an_unfunded_account():
    """c has no grant and has used 2 GPU-h (standing ∞, shown as None); funding it with a
    25 % share of lab changes c's figures and every sibling's share of lab; a pending job
    of c becomes backed. Unknown accounts are refused."""
    import pytest

    text = """
accounts:
  lab:
    grant: 300
    children:
      a: {grant: 100}
      b: {grant: 100}
      c: {grant: 0}
"""
    charges = [ChargeInterval("x", "c", "cat", 1000, NOW - 3 * HOUR, NOW - HOUR),
               ChargeInterval("y", "a", "ann", 2000, NOW - 3 * HOUR, NOW - HOUR)]
    pend = [job("c2", "c", at=2.0), job("c1", "c", at=1.0), job("a1", "a", at=0.5),
            job("ghost", "zz", at=0.1)]
    st = ClusterState(tree(text), inventory(gpus=2), pending=pend, charges=charges)
    out = grant_preview(st, NOW, "c", None, 25.0)
    assert out["account"] == "c" and out["grant_hours"] is None and out["share_pct"] == 25.0
    assert out["before"] == {"grant_hours": 0.0, "share_pct": None}
    assert out["accounts"] == {
        "a": {"usage_hours": 4.0, "grant_before": 100.0, "grant_after": 100.0,
              "standing_before": 0.04, "standing_after": 0.04, "share_before": 0.5,
              "share_after": 100 / 275},
        "b": {"usage_hours": 0.0, "grant_before": 100.0, "grant_after": 100.0,
              "standing_before": 0.0, "standing_after": 0.0, "share_before": 0.5,
              "share_after": 100 / 275},
        "c": {"usage_hours": 2.0, "grant_before": 0.0, "grant_after": 75.0,
              "standing_before": None, "standing_after": 2.0 / 75, "share_before": 0.0,
              "share_after": 75 / 275},
    }
    assert out["backing"] == [
        {"workload": "c1", "project": "c", "user": "u", "backed_before": False,
         "backed_after": True},
        {"workload": "c2", "project": "c", "user": "u", "backed_before": False,
         "backed_after": True}]
    # the account itself is listed even when nothing about it changes
    same = grant_preview(st, NOW, "a", 100.0, None)
    assert list(same["accounts"]) == ["a"] and same["backing"] == []
    # a grant change of a's parent changes lab's figures only where they differ
    lab = grant_preview(st, NOW, "lab", 600.0, None)
    assert set(lab["accounts"]) == {"lab"}
    assert lab["accounts"]["lab"]["standing_after"] == 6.0 / 600
    with pytest.raises(KeyError):
        grant_preview(st, NOW, "nope", 1.0, None)


def test_sibling_shares_of_top_level_accounts_and_of_nothing_used():
    t = tree("""
accounts:
  x: {grant: 30}
  y: {grant: 10, children: {y1: {grant: 4}, y2: {grant: 0}}}
""")
    figs = {"x": {"grant_hours": 30.0, "usage_hours": 0.0},
            "y": {"grant_hours": 10.0, "usage_hours": 0.0},
            "y1": {"grant_hours": 4.0, "usage_hours": 3.0},
            "y2": {"grant_hours": 0.0, "usage_hours": 1.0}}
    assert sibling_shares(t, figs) == {
        "x": {"grant_share": 0.75, "delivered_share": None},
        "y": {"grant_share": 0.25, "delivered_share": None},
        "y1": {"grant_share": 1.0, "delivered_share": 0.75},
        "y2": {"grant_share": 0.0, "delivered_share": 0.25}}


def test_grant_preview_lists_children_whose_grant_moves_with_their_parent():
    """x and y hold 50 % of lab each and have used nothing: raising lab's grant by one
    GPU-hour moves their grants by half an hour each while their standing (0) and their share
    of lab (1/2) stay: they are listed for the grant alone."""
    import pytest

    text = """
accounts:
  lab:
    grant: 200
    children:
      x: {share: 50%}
      y: {share: 50%}
"""
    st = ClusterState(tree(text), inventory(gpus=2))
    out = grant_preview(st, NOW, "lab", 201.0, None)
    assert set(out["accounts"]) == {"lab", "x", "y"}
    assert out["accounts"]["x"] == {"usage_hours": 0.0, "grant_before": 100.0,
                                    "grant_after": 100.5, "standing_before": 0.0,
                                    "standing_after": 0.0, "share_before": 0.5,
                                    "share_after": 0.5}
    with pytest.raises(KeyError, match="nope"):
        grant_preview(st, NOW, "nope", 1.0, None)


def test_sibling_shares_of_small_figures_and_missing_ones():
    t = tree(SMALL)
    sh = sibling_shares(t, {"lab": {"grant_hours": 0.5, "usage_hours": 0.25},
                            "a": {"grant_hours": 0.5, "usage_hours": 0.5}})  # b: no figures
    assert sh["lab"] == {"grant_share": 1.0, "delivered_share": 1.0}
    assert sh["a"] == {"grant_share": 1.0, "delivered_share": 1.0}
    assert sh["b"] == {"grant_share": 0.0, "delivered_share": 0.0}
