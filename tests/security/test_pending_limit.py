"""Attacking the demo hub: one user queued 600 jobs, all accepted — the queue (and every cycle's
work) is anyone's to flood. The budgets file's ``policy: max_pending_per_user`` (default 100)
bounds what one user may have waiting, jobs and sessions together; past it a submission is
refused with 429, saying the limit and how many are pending, and nothing is stored."""

from __future__ import annotations

from tests.fixtures.hub import BUDGETS, http


def pending(svc, tok, user) -> list[str]:  # noqa: ANN001
    jobs = http("GET", f"{svc.api}/jobs", tok)[1]["jobs"]
    sessions = http("GET", f"{svc.api}/sessions?user={user}", tok)[1]["sessions"]
    return [w["id"] for w in jobs + sessions if w["user"] == user and w["state"] == "pending"]


def test_one_user_cannot_flood_the_queue(service_factory, tokens):
    svc = service_factory()
    bob, dave, root = tokens["bob"], tokens["dave"], tokens["root"]
    # nothing starts: every submission stays in the queue
    st, out = http("PUT", f"{svc.api}/nodes/n1/health", root,
                   {"healthy": False, "reason": "queue flood test"})
    assert st == 200, out
    job = {"command": "true", "project": "lattice", "gpus": 1}
    for i in range(100):  # the default limit
        st, out = http("POST", svc.api + "/jobs", bob, {**job, "name": f"flood-{i}"})
        assert st == 201, (i, out)
    st, out = http("POST", svc.api + "/jobs", bob, {**job, "name": "one-too-many"})
    assert st == 429 and out["field"] == "pending", out
    assert "100 workloads waiting" in out["message"], out
    assert "max_pending_per_user: 100" in out["message"], out
    # a session (what the spawner queues for bob) counts the same
    st, out = http("POST", svc.api + "/sessions", root,
                   {"user": "bob", "project": "lattice", "slice": "gpu:1"})
    assert st == 429 and "max_pending_per_user" in out["message"], out
    assert len(pending(svc, bob, "bob")) == 100  # nothing of the refused ones was stored
    # the limit is per user: dave still queues
    st, out = http("POST", svc.api + "/jobs", dave, {**job, "project": "astro"})
    assert st == 201, out
    # one of bob's leaves the queue: one more may come in
    http("DELETE", f"{svc.api}/jobs/{pending(svc, bob, 'bob')[0]}", bob)
    st, out = http("POST", svc.api + "/jobs", bob, {**job, "name": "after-cancel"})
    assert st == 201, out

    # the admin sets the limit in the budgets file: it applies to the next submission
    (svc.dir / "budgets.yaml").write_text(BUDGETS.replace(
        "policy:\n", "policy:\n  max_pending_per_user: 3\n"))
    for _ in range(2):  # dave had one pending: two more make three
        st, out = http("POST", svc.api + "/jobs", dave, {**job, "project": "astro"})
        assert st == 201, out
    st, out = http("POST", svc.api + "/jobs", dave, {**job, "project": "astro"})
    assert st == 429 and "dave has 3 workloads waiting" in out["message"], out
    assert "max_pending_per_user: 3" in out["message"], out
    assert len(pending(svc, dave, "dave")) == 3
