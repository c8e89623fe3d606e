"""Jobs that run after others, against the real service process and the local backend: a
three-step ``afterok`` pipeline whose second step fails cancels the third with its reason;
a waiting job is shown as waiting for the job it needs (not queued for GPUs) and is not
counted against the pending limit; unknown ids and a cycle are refused (400, naming
``after``, nothing queued)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.fixtures.hub import http
from tests.service.test_api import get_w, wait_for


def gate() -> Path:
    """A directory the job's Unix account can read: a step waits until the test creates
    ``go`` in it (no timing involved)."""
    d = Path(tempfile.mkdtemp(prefix="gpubudget-gate-"))
    os.chmod(d, 0o755)
    return d


def job_ids(service, token) -> list[str]:  # noqa: ANN001
    return [j["id"] for j in http("GET", service.api + "/jobs", token)[1]["jobs"]]


def test_a_failed_step_cancels_the_step_after_it_with_the_reason(service, tokens):
    bob, g = tokens["bob"], gate()
    post = lambda body: http("POST", service.api + "/jobs", bob,  # noqa: E731
                             {"project": "lattice", "gpus": 0, **body})
    status, one = post({"command": f"while [ ! -e {g}/go ]; do sleep 0.05; done",
                        "name": "prep"})
    assert status == 201, one
    status, two = post({"command": "exit 1", "name": "train", "after": [one["id"]]})
    assert status == 201, two
    # the third names the second by its name (one of bob's own jobs); afterok by default
    status, three = post({"command": "true", "name": "report", "after": "train"})
    assert status == 201, three
    assert three["after"] == [two["id"]] and three["after_kind"] == "afterok"
    w = wait_for(lambda: (w := get_w(service, bob, two["id"]))["waiting_for"] and w,
                 "the second step to be shown waiting")
    assert w["waiting_for"] == f"waiting for {one['id']} to succeed"
    assert w["state"] == "pending" and w["queue_position"] is None
    (g / "go").touch()
    wait_for(lambda: get_w(service, bob, two["id"])["state"] == "failed", "the second to fail")
    w = wait_for(lambda: (w := get_w(service, bob, three["id"]))["state"] == "cancelled" and w,
                 "the third to be cancelled")
    assert w["started_at"] is None
    assert w["reason"] == (f"cancelled: it ran only after {two['id']} succeeded, and "
                           f"{two['id']} did not succeed")
    assert get_w(service, bob, one["id"])["state"] == "done"


def test_afterany_runs_after_a_failure_and_afternotok_only_after_one(service, tokens):
    bob = tokens["bob"]
    post = lambda body: http("POST", service.api + "/jobs", bob,  # noqa: E731
                             {"project": "lattice", "gpus": 0, **body})
    fail = post({"command": "exit 3"})[1]
    ok = post({"command": "true"})[1]
    anyway = post({"command": "true", "after": [fail["id"]], "after_kind": "afterany"})[1]
    cleanup = post({"command": "true", "after": [fail["id"]], "after_kind": "afternotok"})[1]
    never = post({"command": "true", "after": [ok["id"]], "after_kind": "afternotok"})[1]
    for w, want in [(anyway, "done"), (cleanup, "done"), (never, "cancelled")]:
        wait_for(lambda w=w, want=want: get_w(service, bob, w["id"])["state"] == want,
                 f"{w['id']} to be {want}")


def test_a_job_after_an_array_waits_for_all_its_tasks(service, tokens):
    bob = tokens["bob"]
    arr = http("POST", service.api + "/jobs", bob, {
        "command": "true", "project": "lattice", "gpus": 0, "array": "0-3",
        "max_running": 2})[1]
    status, after = http("POST", service.api + "/jobs", bob, {
        "command": "true", "project": "lattice", "gpus": 0, "after": [arr["id"]]})
    assert status == 201 and after["after"] == [f"{arr['id']}_{i}" for i in range(4)]
    w = wait_for(lambda: (w := get_w(service, bob, after["id"]))["state"] == "done" and w,
                 "the job after the array to run")
    ends = [get_w(service, bob, f"{arr['id']}_{i}")["ended_at"] for i in range(4)]
    assert w["started_at"] >= max(ends)


def test_unknown_ids_and_a_cycle_are_refused_and_nothing_is_queued(service, tokens):
    bob = tokens["bob"]
    before = job_ids(service, bob)
    for body, words in [
        ({"after": ["nosuchjob"]}, "no job or array 'nosuchjob'"),
        ({"after": ["true-one", "nosuchjob"], "name": "x"}, "no job or array"),
        ({"name": "loop", "after": ["loop"]}, "cycle loop -> loop"),
        ({"after": ["x"], "after_kind": "afterwards"}, "afterok"),
        ({"after_kind": "afterany"}, "only with 'after'"),
    ]:
        status, out = http("POST", service.api + "/jobs", bob,
                           {"command": "true", "project": "lattice", "gpus": 0, **body})
        assert status == 400, (body, out)
        assert out["field"] in ("after", "after_kind") and words in out["message"], out
    assert job_ids(service, bob) == before


def test_a_waiting_job_is_not_counted_against_the_pending_limit(service, tokens):
    """The policy allows 100 pending per user (hub fixture's default): 100 jobs waiting for
    a gated one still leave room for an ordinary submission."""
    bob, g = tokens["bob"], gate()
    first = http("POST", service.api + "/jobs", bob, {
        "command": f"while [ ! -e {g}/go ]; do sleep 0.05; done", "project": "lattice",
        "gpus": 0})[1]
    ids = []
    for _ in range(101):
        status, w = http("POST", service.api + "/jobs", bob, {
            "command": "true", "project": "lattice", "gpus": 0, "after": [first["id"]],
            "after_kind": "afternotok"})
        assert status == 201, w
        ids.append(w["id"])
    status, w = http("POST", service.api + "/jobs", bob,
                     {"command": "true", "project": "lattice", "gpus": 0})
    assert status == 201, w
    (g / "go").touch()  # it succeeds: every afternotok job is cancelled
    wait_for(lambda: all(get_w(service, bob, i)["state"] == "cancelled" for i in ids),
             "the waiting jobs to be cancelled", timeout=60)
