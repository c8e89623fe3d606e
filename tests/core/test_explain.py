"""Why work waits (docs/core.md, "Why work waits"), word for word: every reason with its
message, backing, expected start and blocker, on clusters small enough to check by hand."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpubudget.core.explain import Wait, _held_for_reservations, why_waiting
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import (
    HOUR,
    ChargeInterval,
    Placement,
    Policy,
    SliceAlloc,
    SliceRequest,
)
from jupyter_gpubudget.core.scheduler import ClusterState, Scheduler

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


def running(wid, project, node, gpu, *, protected_until=None, backed=True, limit=HOUR, **kw):
    w = job(wid, project, limit=limit)
    return replace(w, started_at=NOW - 60, backed=backed, protected_until=protected_until,
                   placement=Placement((SliceAlloc(node, gpu),)), **kw)


def test_every_reason_word_for_word():
    run = [running("r0", "a", "n0", 0, protected_until=NOW + HOUR),
           running("r1", "a", "n1", 0, protected_until=NOW + HOUR)]
    pend = [job("cap", "a", at=1.0), job("unb", "b", at=2.0, min_runtime=5 * HOUR),
            job("ghost", "nowhere", at=3.0), job("big", "a", gpus=2, at=4.0)]
    charges = [ChargeInterval("old", "b", "ben", 1000, NOW - 2 * HOUR, NOW - HOUR)]
    state = ClusterState(tree(SMALL), inventory(nodes=2, gpus=1), running=run, pending=pend,
                         charges=charges)
    got = why_waiting(state, NOW)
    assert got == {
        "cap": Wait("cap", "capacity", "no 1 whole GPU free: the work holding the capacity is "
                    "protected or its project stands below this one", backed=True),
        "unb": Wait("unb", "unbacked", "unbacked (account 'b' has used or promised 1.0 of its "
                    "1.0 GPU-hours): it runs only on idle capacity and never displaces other "
                    "work, and no idle 1 whole GPU is free", backed=False),
        "ghost": Wait("ghost", "unknown-project", "project 'nowhere' is not in the budgets "
                      "file: it cannot be charged, so it is never started", backed=False),
        # r0 and r1 started a minute ago, predicted 1 h: both GPUs free at NOW + 59 min
        "big": Wait("big", "reserved", "2 whole GPUs: the GPUs it needs are held for it as "
                    "running work ends", backed=True, at=NOW + HOUR - 60),
    }
    assert [w.id for w in state.pending] == ["cap", "unb", "ghost", "big"]  # untouched


def test_the_first_account_short_on_the_path_is_named_with_what_it_promised():
    """The program has used 150 of 200 and promised 40 (a's protected runs): a 20-hour
    protected job of a is short at the program, though a's own grant would cover it."""
    text = """
accounts:
  prog:
    grant: 200
    children:
      a: {grant: 1000}
"""
    run = [running("r0", "a", "n0", 0, protected_until=NOW + 40 * HOUR)]
    state = ClusterState(tree(text), inventory(gpus=1), running=run,
                         pending=[job("w", "a", min_runtime=20 * HOUR, kind="batch")],
                         charges=[ChargeInterval("c", "a", "x", 1000, NOW - 150 * HOUR, NOW)])
    (w,) = why_waiting(state, NOW).values()
    assert w == Wait("w", "unbacked", "unbacked (account 'prog' has used or promised 190.0 of "
                     "its 200.0 GPU-hours): it runs only on idle capacity and never displaces "
                     "other work, and no idle 1 whole GPU is free", backed=False)


def test_work_that_starts_says_whether_it_is_backed():
    state = ClusterState(tree(SMALL), inventory(gpus=2),
                         pending=[job("go", "a"), job("unb", "b", min_runtime=5 * HOUR)])
    got = why_waiting(state, NOW)
    msg = "1 whole GPU is free for it: it starts in the next scheduling cycle"
    assert got == {"go": Wait("go", "starts", msg, backed=True),
                   "unb": Wait("unb", "starts", msg, backed=False)}


def test_work_waiting_for_a_stopping_session_and_for_a_reservation():
    # b's unbacked session on GPU 0 is snapshotted before it stops; a's job waits for it
    sess = running("s", "b", "n0", 0, backed=False, kind="interactive", stops_at_once=False)
    state = ClusterState(tree(SMALL), inventory(gpus=1), running=[sess],
                         pending=[job("want", "a", at=1.0)],
                         charges=[ChargeInterval("c", "b", "x", 1000, NOW - 5 * HOUR, NOW)])
    (w,) = why_waiting(state, NOW).values()
    assert w == Wait("want", "reserved", "1 whole GPU: preempted work is stopping to free its "
                     "slice", backed=True, at=NOW + 120.0)
    # a gang reserved from NOW + 59 min; a long 1-GPU job may not take the free GPU
    run = [running("r0", "a", "n0", 0, protected_until=NOW + 10 * HOUR)]
    state = ClusterState(tree(), inventory(gpus=2), running=run,
                         pending=[job("gang", "a", gpus=2, at=1.0, limit=HOUR),
                                  job("long", "b", at=2.0, limit=20 * HOUR)])
    got = why_waiting(state, NOW)
    assert got["gang"] == Wait("gang", "reserved", "2 whole GPUs: the GPUs it needs are held "
                               "for it as running work ends", backed=True, at=NOW + HOUR - 60)
    assert got["long"] == Wait("long", "reservation", "1 whole GPU is free, but held for a "
                               "waiting gang that starts before this work would end",
                               backed=True, blocker="gang")


def test_a_mig_mode_gpu_in_service_that_could_hold_it_is_not_called_draining():
    """n0's one GPU is out of service; n1's is in MIG mode, busy with a protected instance.
    A one-GPU job could take n1's GPU whole (the policy's ``whole_gpu_on_mig``) once that
    ends, so it waits for capacity — the empty cluster the reason is checked on follows the
    policy's placement rules."""
    inv = Inventory((make_node("n0", "H100-80GB", 1), make_node("n1", "H100-80GB", 1, mig=(0,))))
    inst = replace(job("inst", "a", req=SliceRequest.mig("1g.10gb")), started_at=NOW - 60,
                   protected_until=NOW + HOUR,
                   placement=Placement((SliceAlloc("n1", 0, "mig", 143, 6, "1g.10gb"),)))
    state = ClusterState(tree(SMALL), inv, running=[inst], pending=[job("one", "a")],
                         unhealthy=frozenset({"n0"}))
    assert why_waiting(state, NOW)["one"].reason == "capacity"
    off = replace(state, policy=Policy(whole_gpu_on_mig=False))
    assert why_waiting(off, NOW)["one"].reason == "draining"


def test_draining_when_only_nodes_out_of_service_could_hold_it():
    state = ClusterState(tree(SMALL), inventory(nodes=2, gpus=2),
                         pending=[job("pair", "a", gpus=2), job("one", "b", min_runtime=2 * HOUR)],
                         unhealthy=frozenset({"n0", "n1"}))
    got = why_waiting(state, NOW)
    assert got["pair"] == Wait("pair", "draining", "the only nodes that can hold 2 whole GPUs "
                               "are out of service (draining or waiting for repair)",
                               backed=True)
    assert got["one"].reason == "draining" and got["one"].backed is False
    s = Scheduler.from_state(state)
    assert not _held_for_reservations(s)
    s.reservations["x"] = (NOW, Placement(()))
    assert _held_for_reservations(s)
