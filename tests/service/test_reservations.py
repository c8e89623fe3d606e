"""Advance reservations against the real service process and the local backend: who may
book, cancel and see; every refusal is a 400 naming its field with nothing booked; and a
booking's window in action — another project's job on the GPUs is preempted at the window's
start and the booking's project's job, waiting before it, starts inside it. The CLI lists,
creates and cancels."""

from __future__ import annotations

import json
import time

import pytest

from jupyter_gpubudget.cli import main
from tests.fixtures.hub import http
from tests.service.test_api import get_w, wait_for

DAY = 86400.0


def book(service, token, **body):  # noqa: ANN001, ANN003, ANN201
    return http("POST", service.api + "/reservations", token, body)


def listed(service, token):  # noqa: ANN001, ANN201
    status, out = http("GET", service.api + "/reservations?all=1", token)
    assert status == 200, out
    return out["reservations"]


def test_admins_and_managers_book_members_read_others_see_nothing(service, tokens):
    t0 = time.time() + 20 * DAY
    status, b = book(service, tokens["root"], project="genomics", gpus=1, start=t0,
                     end=t0 + 3600, note="course")
    assert status == 201 and b["state"] == "booked" and b["nodes"] == ["n1"], b
    # alice manages physics: she books for lattice, not for genomics
    status, mine = book(service, tokens["alice"], project="lattice", gpus=1, start=t0,
                        end=t0 + 3600)
    assert status == 201, mine
    status, out = book(service, tokens["alice"], project="genomics", gpus=1,
                       start=t0 + 7200, end=t0 + 9000)
    assert status == 403 and "genomics" in out["message"]
    assert book(service, tokens["bob"], project="lattice", gpus=1, start=t0 + 7200,
                end=t0 + 9000)[0] == 403  # a member reads, does not book
    # a manager books at most policy manager_booking_limit (8) GPUs at a time; an admin more
    status, out = book(service, tokens["alice"], project="lattice", gpus=9, start=t0 + 7200,
                       end=t0 + 9000)
    assert status == 403 and "manager_booking_limit" in out["message"], out
    status, out = book(service, tokens["root"], project="lattice", gpus=9, start=t0 + 7200,
                       end=t0 + 9000)
    assert status == 400 and out["field"] == "gpus", out  # only over capacity (2 GPUs here)
    ids = lambda tok: {r["id"] for r in listed(service, tok)}  # noqa: E731
    assert mine["id"] in ids(tokens["bob"]) and b["id"] not in ids(tokens["bob"])
    assert b["id"] in ids(tokens["erin"]) and mine["id"] not in ids(tokens["erin"])
    assert http("GET", f"{service.api}/reservations/{b['id']}", tokens["bob"])[0] == 403
    assert http("DELETE", f"{service.api}/reservations/{b['id']}", tokens["alice"])[0] == 403
    for rid, tok in ((b["id"], tokens["root"]), (mine["id"], tokens["alice"])):
        status, out = http("DELETE", f"{service.api}/reservations/{rid}", tok)
        assert status == 200 and out["state"] == "cancelled", out
    assert http("DELETE", f"{service.api}/reservations/{b['id']}", tokens["root"])[0] == 404


@pytest.mark.parametrize("body,field,words", [
    (dict(project="lattice", gpus=1, start=-3600.0, end=3600.0), "start", "past"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=40 * DAY), "end", "after it starts"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=39 * DAY), "end", "after it starts"),
    (dict(project="lattice", gpus=3, start=40 * DAY, end=41 * DAY), "gpus", "over capacity"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=41 * DAY, nodes=["n1"]), "nodes",
     "overlap"),
    (dict(project="nope", gpus=1, start=40 * DAY, end=41 * DAY), "project", "no project"),
    (dict(project="physics", gpus=1, start=40 * DAY, end=41 * DAY), "project", "no project"),
    (dict(project="lattice", gpus="2", start=40 * DAY, end=41 * DAY), "gpus", "whole number"),
    (dict(project="lattice", gpus=10**12, start=40 * DAY, end=41 * DAY), "gpus",
     "whole number"),
    (dict(project="lattice", gpus=1, start="tomorrow", end=41 * DAY), "start", "ISO 8601"),
    (dict(project="lattice", gpus=1, start=1e300, end=1e301), "start", "out of range"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=41 * DAY, colour="red"), "colour",
     "unknown field"),
    (dict(project="lattice", gpus=1, end=41 * DAY), "start", "required"),
    # MIG instances: this service's nodes have no GPU in MIG mode
    (dict(project="lattice", gpus=1, start=40 * DAY, end=41 * DAY, mig_profile="1g.10gb"),
     "mig_profile", "no GPU there is in MIG mode"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=41 * DAY, mig_profile=7),
     "mig_profile", "a string"),
    (dict(project="lattice", gpus=1, start=40 * DAY, end=41 * DAY, mig_profile="1g.10gb",
          gpu_model="H100-80GB"), "gpu_model", "not with mig_profile"),
])
def test_a_refused_booking_is_a_400_naming_its_field_and_books_nothing(service, tokens, body,
                                                                       field, words):
    now = time.time()
    root = tokens["root"]
    # another booking holds both GPUs of n1 around day 40 (the overlap case runs into it)
    status, held = book(service, root, project="astro", gpus=2, start=now + 40 * DAY - 3600,
                        end=now + 40 * DAY + 1800)
    assert status == 201, held
    try:
        before = listed(service, root)
        for key in ("start", "end"):
            if isinstance(body.get(key), float) and abs(body[key]) < 1e9:
                body = {**body, key: now + body[key]}
        if field == "nodes":
            words = held["id"]
        status, out = book(service, root, **body)
        assert status == 400 and out["field"] == field and words in out["message"], out
        assert listed(service, root) == before
    finally:
        http("DELETE", f"{service.api}/reservations/{held['id']}", root)


def test_the_bookings_project_has_its_gpus_inside_its_window(service, tokens):
    """dave's (astro) job runs on both GPUs of n1 with no protection; alice books them for
    lattice from a few seconds on; bob's lattice job waits before the window and starts
    inside it, and dave's job is preempted at its start with the booking named."""
    dave, bob = tokens["dave"], tokens["bob"]
    status, other = http("POST", service.api + "/jobs", dave, {
        "command": "sleep 300", "project": "astro", "gpus": 2, "name": "squatter"})
    assert status == 201, other
    wait_for(lambda: get_w(service, dave, other["id"])["state"] == "running", "dave's job")
    start = time.time() + 6
    status, b = book(service, tokens["alice"], project="lattice", gpus=2, start=start,
                     end=start + 600)
    assert status == 201, b
    try:
        status, mine = http("POST", service.api + "/jobs", bob, {
            "command": "sleep 300", "project": "lattice", "gpus": 2, "name": "booked"})
        assert status == 201, mine
        w = wait_for(lambda: (w := get_w(service, bob, mine["id"]))["state"] == "running"
                     and w, "bob's job to start in the window", timeout=60)
        assert w["started_at"] >= start
        assert sorted(s["gpu"] for s in w["placement"]) == [0, 1]
        assert get_w(service, dave, other["id"])["state"] != "running"
        status, audit = http("GET", f"{service.api}/audit?workload={other['id']}",
                             tokens["root"])
        assert status == 200 and any("booked" in json.dumps(e) and b["id"] in json.dumps(e)
                                     for e in audit["entries"]), audit
    finally:
        http("DELETE", f"{service.api}/reservations/{b['id']}", tokens["root"])
        for wid, tok in ((mine["id"], bob), (other["id"], dave)):
            http("DELETE", f"{service.api}/jobs/{wid}", tok)
    # cancelled inside its window: its idle part up to then is charged after the next cycle
    # (at the policy's default share, half); the GPUs went from dave's job to bob's without
    # a gap (bob's charge opened when dave's closed), so next to nothing sat idle
    d = wait_for(lambda: next((d for d in http(
        "GET", f"{service.api}/decisions?kind=booking-charge&workload={b['id']}",
        tokens["root"])[1]["decisions"]), None), "the booking's idle part to be charged")
    idle, charged = d["detail"]["idle_gpu_hours"], d["detail"]["charged_gpu_hours"]
    assert 0 <= idle < 2 * 60 / 3600 and charged == round(idle * 0.5, 6), d


def test_cli_lists_creates_and_cancels(service, tokens, capsys):
    def run(*argv: str) -> tuple[int, str, str]:
        rc = main(["reservations", argv[0], f"--url={service.base}",
                   f"--token={tokens['root']}", *argv[1:]])
        out = capsys.readouterr()
        return rc, out.out, out.err

    rc, out, err = run("create", "--project", "genomics", "--gpus", "1", "--start",
                       "2099-01-05 10:00", "--end", "2099-01-05 12:00", "--note", "demo")
    assert rc == 0 and out.startswith("booked bk-") and "genomics" in out, err
    bid = out.split()[1].rstrip(":")
    rc, out, _ = run("list")
    assert rc == 0 and bid in out and "2099-01-05 10:00" in out and "2099-01-05 12:00" in out
    with pytest.raises(SystemExit):  # the service's reason, on stderr
        run("create", "--project", "genomics", "--gpus", "5", "--start", "2099-01-05 10:00",
            "--end", "2099-01-05 12:00")
    assert "over capacity" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # MIG instances: this service's nodes have none
        run("create", "--project", "genomics", "--gpus", "2", "--mig-profile", "1g.10gb",
            "--start", "2099-01-05 10:00", "--end", "2099-01-05 12:00")
    assert "no GPU there is in MIG mode" in capsys.readouterr().err
    rc, out, _ = run("list", "--json")
    assert rc == 0 and all(b["mig_profile"] is None for b in json.loads(out)["reservations"])
    rc, out, _ = run("cancel", bid)
    assert rc == 0 and f"cancelled {bid}" in out
    rc, out, _ = run("list")
    assert bid not in out
