"""A session's history across preemptions (``GET /sessions/{id}/history``,
``handlers/sessions.py: session_history``): the server the user sees is the session and the
ones it resumed; each charge interval is a segment with where it ran, what it cost and how
and why it ended. Runs on the real ledger, SQLite and a real PostgreSQL server."""

from __future__ import annotations

import calendar

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import nodes as N
from jupyter_gpubudget.service.handlers.sessions import session_history
from tests.fixtures.postgres import db_url  # noqa: F401

BUDGETS = ("accounts: {lab: {grant: 10, children: {lattice-qcd: {grant: 10, "
           "members: [alice]}}}}")
SNAP = "1da59d6be1b14462--1a248cd5c2c-c05946"


def at(hh: int, mm: int) -> float:
    return float(calendar.timegm((2026, 12, 6, hh, mm, 0)))


def slice_on(node: str) -> list[dict]:
    return [{"node": node, "gpu": 0, "kind": "gpu", "milli": 1000}]


def test_a_session_drained_and_restored_elsewhere_is_one_history(db_url):  # noqa: F811
    """Started 10:02 on h100-a, preempted 12:40 because the admins drain h100-a (their note:
    fan failure), restored 12:43 on h100-b as the resume of the first: two segments, each
    with its cost, and the total."""
    upgrade(db_url)
    led = Ledger(connect(db_url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        w1 = led.submit(project="lattice-qcd", user="alice", kind="interactive",
                        request={"kind": "gpu", "gpus": 1}, now=at(10, 1), backend="hub",
                        name="alice/", resumable=True)
        led.start(w1.id, placement=slice_on("h100-a"), milli=1000, backed=True,
                  protected_until=at(11, 2), now=at(10, 2))
        N.mark_unhealthy(led, "h100-a", "fan failure", "admin", "root", at(12, 35))
        led.record_decision(now=at(12, 39), kind="preempt-requested", workload=w1.id,
                            reason="node h100-a is draining (loses 0.00 GPU-h)",
                            detail={"for": None, "lost_gpu_hours": 0.0})
        led.stop(w1.id, now=at(12, 40), state="preempted", closed_by="preempt")
        w2 = led.submit(project="lattice-qcd", user="alice", kind="interactive",
                        request={"kind": "gpu", "gpus": 1}, now=at(12, 40), backend="hub",
                        name="alice/", resumable=True)
        led.record_decision(now=at(12, 40), kind="requeue", workload=w1.id, actor="root",
                            reason=f"preempted after snapshot {SNAP}; requeued as {w2.id}",
                            detail={"as": w2.id, "snapshot": SNAP})
        led.record_decision(now=at(12, 40), kind="resume", workload=w2.id, actor="root",
                            reason="resumes", detail={"resumes": w1.id, "snapshot": SNAP,
                                                      "reason": "preempted"})
        led.start(w2.id, placement=slice_on("h100-b"), milli=1000, backed=True,
                  protected_until=at(13, 43), now=at(12, 43))

        h = session_history(led, w2.id, at(13, 43))
        got = [(g["workload"], g["start"], g["end"], g["nodes"], g["ended"], g["why"])
               for g in h["segments"]]
        assert got == [
            (w1.id, at(10, 2), at(12, 40), ["h100-a"], "preempted", "node drained: fan failure"),
            (w2.id, at(12, 43), None, ["h100-b"], None, None),
        ]
        assert [g["gpu_hours"] for g in h["segments"]] == pytest.approx([158 / 60, 1.0])
        assert h["total_gpu_hours"] == pytest.approx(158 / 60 + 1.0)
        assert h["segments"][1]["placement"] == slice_on("h100-b")
        # the first session alone: its own segment, ended the same way
        first = session_history(led, w1.id, at(13, 43))
        assert [g["workload"] for g in first["segments"]] == [w1.id]
    finally:
        led.dispose()


def test_a_session_that_never_started_has_no_segments(db_url):  # noqa: F811
    upgrade(db_url)
    led = Ledger(connect(db_url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        w = led.submit(project="lattice-qcd", user="alice", kind="interactive",
                       request={"kind": "gpu", "gpus": 1}, now=at(9, 0), backend="hub",
                       name="alice/", resumable=True)
        h = session_history(led, w.id, at(9, 5))
        assert h["segments"] == [] and h["total_gpu_hours"] == 0
    finally:
        led.dispose()


def test_an_idle_report_is_not_why_a_session_stopped(db_url):  # noqa: F811
    """Reported idle at 11:00 (a notice, but nothing stopped), then stopped by its user at
    11:30: the segment ended, with no reason invented from the idle report."""
    upgrade(db_url)
    led = Ledger(connect(db_url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        w = led.submit(project="lattice-qcd", user="alice", kind="interactive",
                       request={"kind": "gpu", "gpus": 1}, now=at(10, 0), backend="hub",
                       name="alice/", resumable=True)
        led.start(w.id, placement=slice_on("h100-a"), milli=500, backed=True,
                  protected_until=at(11, 0), now=at(10, 0))
        led.record_decision(now=at(11, 0), kind="idle", workload=w.id, reason="idle 1 h")
        led.stop(w.id, now=at(11, 30), state="done", closed_by="stop")
        (g,) = session_history(led, w.id, at(12, 0))["segments"]
        assert (g["ended"], g["why"], g["end"]) == ("ended", None, at(11, 30))
        assert g["gpu_hours"] == pytest.approx(0.75)
    finally:
        led.dispose()
