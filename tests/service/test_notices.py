"""Notices in words (service/notices.py, service/delivery.py ``notice_of``): one test per
kind of decision compares the notice with the words a researcher should read — what
happened, why, what was saved, where the work went, what to do — with the server's display
name ("your server", never ``alice/``) and the ids only in ``details``. The ledger-backed
tests run on SQLite and a real PostgreSQL server."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger import nodes as N
from jupyter_gpubudget.service.delivery import is_notice, notice_of
from jupyter_gpubudget.service.notices import build_notice, server_label
from tests.fixtures.postgres import db_url  # noqa: F401

SESSION = {"id": "b8d7875348934e50", "name": "alice/", "user": "alice",
           "project": "lattice-qcd", "kind": "interactive", "resumable": True,
           "state": "done"}
JOB = {"id": "0f3a9c", "name": "train", "user": "alice", "project": "lattice-qcd",
       "kind": "batch", "resumable": True, "state": "pending"}
SNAP = "1da59d6be1b14462--1a248cd5c2c-c05946"


def no_ids_in_words(n, *ids):
    for i in ids:
        assert i not in n.title and i not in n.body, (i, n)
    assert "alice/" not in n.title and "alice/" not in n.body


@pytest.mark.parametrize(("name", "kind", "label"), [
    ("alice/", "interactive", "your server"),
    ("alice/gpu", "interactive", "your server “gpu”"),
    ("alice", "interactive", "your server"),
    ("", "interactive", "your server"),
    ("train", "batch", "your job “train”"),
    ("", "batch", "your job"),
])
def test_server_label_never_shows_user_slash(name, kind, label):
    assert server_label(name, "alice", kind) == label


def test_notice_backed_work_needed_the_slice_requeued_with_snapshot():
    n = build_notice(
        kind="requeue", actor="root",
        reason=f"preempted after snapshot {SNAP}; requeued as 5e7c",
        detail={"as": "5e7c", "snapshot": SNAP}, workload=SESSION,
        cause_reason="unbacked work yields to backed work (loses 0.40 GPU-h)")
    assert n.cause == "needed"
    assert n.title == "Your server (project lattice-qcd) was preempted"
    assert n.body == (
        "Your server (project lattice-qcd) was stopped to free its GPU slice. Work backed by "
        "its project's grant needed the slice, and yours ran unbacked (its project's grant "
        "did not cover it), so it was not protected. Your kernels were saved in a verified "
        "snapshot just before it stopped: variables, imports and open notebooks come back as "
        "they were. It is back in the queue as a resume with its saved kernels: when a slice "
        "is free it starts again — possibly on another node — and restores them before your "
        "browser reconnects. Nothing to do: keep the tab open or come back later; the queue "
        "shows when it is predicted to start.")
    assert n.details["snapshot"] == SNAP and n.details["requeued_as"] == "5e7c"
    assert n.details["workload"] == SESSION["id"]
    no_ids_in_words(n, SNAP, "5e7c", SESSION["id"])


def test_notice_project_standing_preempts_a_batch_job():
    n = build_notice(kind="preempt", reason="project cosmo stands above lattice-qcd "
                     "(loses 1.20 GPU-h)", detail={"for": "77aa", "requeued": True},
                     workload=JOB)
    assert n.cause == "needed"
    assert n.title == "Your job “train” (project lattice-qcd) was preempted"
    assert n.body == (
        "Your job “train” (project lattice-qcd) was stopped to free its GPU slice. Backed "
        "work of project lattice-qcd needed the slice: project cosmo had used more of its "
        "grant, and its protected time was over. Nothing of a batch job's memory is saved: "
        "it starts again from its command (resume from your own checkpoints). It is back in "
        "the queue, in its place by submission time, and starts again when a slice is free. "
        "Nothing to do; `gpubudget jobs` shows where it waits.")
    assert n.details["for_workload"] == "77aa"
    no_ids_in_words(n, "77aa", JOB["id"])


def test_notice_a_checkpointed_batch_job_resumes_where_it_stopped():
    n = build_notice(kind="preempt", reason="unbacked work yields to backed work "
                     "(loses 0.40 GPU-h)", detail={"for": "77aa", "requeued": True,
                                                    "checkpoint": SNAP}, workload=JOB)
    assert n.title == "Your job “train” (project lattice-qcd) was preempted"
    assert n.body == (
        "Your job “train” (project lattice-qcd) was stopped to free its GPU slice. Work backed "
        "by its project's grant needed the slice, and yours ran unbacked (its project's grant "
        "did not cover it), so it was not protected. Its processes were checkpointed just "
        "before it stopped (everything they held in memory was saved): it resumes where it "
        "stopped, not from its command. It is back in the queue, in its place by submission "
        "time, and starts again when a slice is free. Nothing to do; `gpubudget jobs` shows "
        "where it waits.")
    assert n.details["checkpoint"] == SNAP
    no_ids_in_words(n, SNAP, "77aa", JOB["id"])


def test_notice_drain_shows_the_admins_note():
    n = build_notice(kind="requeue", actor="root",
                     reason=f"preempted after snapshot {SNAP}; requeued as 5e7c",
                     detail={"as": "5e7c", "snapshot": SNAP}, workload=SESSION,
                     cause_reason="node gpu-07 is draining (loses 0.00 GPU-h)",
                     drain_note="fan replacement, back by 14:00 — shown to everyone",
                     drain_node="gpu-07")
    assert n.cause == "drain"
    assert n.title == ("Your server (project lattice-qcd) was stopped: its node is being "
                       "drained")
    assert n.body.startswith(
        "Your server (project lattice-qcd) was stopped to free its GPU slice. Its node gpu-07 "
        "is being drained for maintenance, so the work on it had to stop. The "
        "administrators' note: “fan replacement, back by 14:00 — shown to everyone”. Your "
        "kernels were saved in a verified snapshot")
    assert "back in the queue as a resume with its saved kernels" in n.body


def test_notice_idle_session_loses_protection():
    n = build_notice(kind="idle", reason="reported idle", workload=SESSION)
    assert (n.cause, n.title) == ("idle", "Your server (project lattice-qcd) is idle: its "
                                          "protection ended")
    assert n.body == (
        "Your server (project lattice-qcd) has used its GPU too little for a while, so its "
        "protected time ended early. It keeps running, but waiting work may now take its "
        "slice (after a snapshot of its kernels). Nothing was saved yet. Use the GPU again, "
        "or stop the server if you are done, so the project is not charged for idle time.")


def test_notice_idle_hibernation():
    n = build_notice(kind="hibernate", reason=f"idle: snapshot {SNAP} taken, slice released",
                     detail={"snapshot": SNAP}, workload=SESSION, actor="alice")
    assert (n.cause, n.title) == ("hibernate", "Your server (project lattice-qcd) was "
                                               "hibernated after being idle")
    assert n.body == (
        "Your server (project lattice-qcd) was idle, so it was stopped and its GPU slice "
        "released; charging stopped with it. Your kernels were saved in a verified snapshot. "
        "Nothing is queued: open the server again from the hub when you need it, and the "
        "kernels are restored as they were.")
    assert n.details["snapshot"] == SNAP
    no_ids_in_words(n, SNAP)


def test_notice_time_limit():
    n = build_notice(kind="timeout", reason="time limit 7200 s", workload=JOB)
    assert (n.cause, n.title) == ("time_limit", "Your job “train” (project lattice-qcd) "
                                                "reached its time limit")
    assert n.body == (
        "Your job “train” (project lattice-qcd) ran for the whole time limit it was given "
        "(2 h) and was stopped. Nothing was saved by the service and it was not requeued. "
        "Submit it again with a longer time limit, or resume from your own checkpoints.")


def test_notice_cancel_by_an_admin():
    n = build_notice(kind="cancel", actor="root", workload=JOB)
    assert (n.cause, n.title) == ("cancel", "Your job “train” (project lattice-qcd) was "
                                            "cancelled by an administrator")
    assert n.body == (
        "An administrator (root) cancelled your job “train” (project lattice-qcd). It stopped "
        "and was not requeued; nothing was saved by the service. Ask the administrators why, "
        "or submit it again.")


def test_notice_restore_failed():
    n = build_notice(kind="snapshot_lost", reason="restore_failed: criu restore failed "
                     "(exit 1)", workload=SESSION)
    assert (n.cause, n.title) == ("restore_failed", "Your server (project lattice-qcd) could "
                                                    "not be restored")
    assert n.body == (
        "Your server (project lattice-qcd) was to come back from its saved kernels, but that "
        "failed: restore_failed: criu restore failed (exit 1). Your notebooks' files are "
        "untouched; the kernels start empty, so run the notebooks again. The loss is "
        "recorded; tell the administrators if it happens again.")


def test_notice_restore_report_with_an_error():
    n = build_notice(kind="restore", actor="alice", reason="nothing restored",
                     detail={"snapshot": SNAP, "error": "the snapshot's kernel died on start",
                             "kernels": []}, workload=SESSION)
    assert (n.cause, n.title) == ("restore_failed", "Your server (project lattice-qcd) could "
                                                    "not be restored")
    assert n.body.startswith("Your server (project lattice-qcd) was to come back from its "
                             "saved kernels, but that failed: the snapshot's kernel died on "
                             "start. Your notebooks' files are untouched;")
    assert n.details["snapshot"] == SNAP
    no_ids_in_words(n, SNAP)


def test_notice_preempted_without_snapshot_says_what_was_lost():
    n = build_notice(kind="preempt", reason="an idle session yields to waiting work "
                     "(loses 0.25 GPU-h)", detail={"requeued": False, "lost_gpu_hours": 0.25},
                     workload={**SESSION, "resumable": False})
    assert n.body == (
        "Your server (project lattice-qcd) was stopped to free its GPU slice. Waiting work "
        "needed the slice, and your session had been idle, so it was no longer protected. "
        "No snapshot was saved: the kernels' state since the server started is lost. About "
        "0.25 GPU-hours of work since the last save were lost. It was not requeued (it was "
        "not submitted as resumable). Start it again when you need it (the spawn form shows "
        "when a slice is predicted to be free).")


def test_notice_admin_requeue_of_a_batch_job():
    n = build_notice(kind="requeue", actor="root", reason="requeued by root", workload=JOB)
    assert n.title == "Your job “train” (project lattice-qcd) was requeued by an administrator"
    assert n.body.startswith("An administrator (root) stopped your job “train” (project "
                             "lattice-qcd) and put it back in the queue.")


BUDGETS = ("accounts: {lab: {grant: 10, children: {lattice-qcd: {grant: 10, "
           "members: [alice]}}}}")


def test_notice_from_the_ledger_finds_the_cause_and_the_drain_note(db_url):  # noqa: F811
    """A session preempted by a drain and requeued: the requeue's own reason carries only
    ids; the notice reads the core's reason recorded before it and the admin's note."""
    upgrade(db_url)
    led = Ledger(connect(db_url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), 1.0)
        w = led.submit(project="lattice-qcd", user="alice", kind="interactive",
                       request={"kind": "gpu", "gpus": 1}, now=2.0, backend="hub",
                       name="alice/", resumable=True)
        N.mark_unhealthy(led, "gpu-07", "fan replacement — shown to everyone", "admin",
                         "root", 3.0)
        led.record_decision(now=4.0, kind="preempt-requested", workload=w.id,
                            reason="node gpu-07 is draining (loses 0.00 GPU-h)",
                            detail={"for": None, "lost_gpu_hours": 0.0})
        led.record_decision(now=5.0, kind="requeue", workload=w.id, actor="root",
                            reason=f"preempted after snapshot {SNAP}; requeued as x1",
                            detail={"as": "x1", "snapshot": SNAP})
        led.record_decision(now=6.0, kind="cancel", workload=w.id, actor="alice")
        led.record_decision(now=7.0, kind="restore", workload=w.id, actor="alice",
                            detail={"error": None, "kernels": [{"restored": ["x"]}]})
        led.record_decision(now=8.0, kind="restore", workload=w.id, actor="alice",
                            detail={"error": "kernel died", "kernels": []})
        got = [(d, r) for d, r in led.notices_for("alice")]
        assert [d.kind for d, _ in got] == ["restore", "restore", "cancel", "requeue"]
        # her own cancel and a restore that worked: no notice
        assert [is_notice(d, r) for d, r in got] == [True, False, False, True]
        assert notice_of(led, *got[0]).cause == "restore_failed"
        n = notice_of(led, *got[3])
        assert n.cause == "drain"
        assert "The administrators' note: “fan replacement — shown to everyone”." in n.body
        assert "a resume with its saved kernels" in n.body
        no_ids_in_words(n, SNAP, "x1", w.id)
        assert n.details == {"workload": w.id, "project": "lattice-qcd", "name": "alice/",
                             "at": 5.0, "snapshot": SNAP, "requeued_as": "x1",
                             "for_workload": None}
    finally:
        led.dispose()


def test_queue_page_says_a_requeued_session_is_a_resume_and_why_it_waits():
    from jupyter_gpubudget.hub.queue import resuming_words

    words = resuming_words({"reason": "preempted", "snapshot": SNAP})
    assert words == (
        "Resuming your session (preempted): a resume with your saved kernels, not a fresh "
        "server. It was preempted to free its slice, so it waits for a slice again like any "
        "request; once it gets one (possibly on another node) the kernels are restored "
        "before the page reconnects.")
    assert SNAP not in words
    assert resuming_words({"reason": "resumed by its user"}).startswith(
        "Resuming your session (hibernated): a resume with your saved kernels")
