"""The endpoints the researcher's views use, against the real service process registered with
a real JupyterHub: usage per day in a time zone, a job's output (tail, paging, UTF-8 cut
points, a link the job planted), the preemption deadline of a session, the slices that would
start now for a queued session, and one quote for the spawn form."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import ServiceProc, http
from tests.service.conftest import cleanup

# one whole GPU and one MIG-partitioned GPU: a queued whole-GPU session can be told that a
# MIG slice is free (the MIG GPU is kept for slices: whole_gpu_on_mig off)
INVENTORY = """\
nodes:
  - name: n1
    model: H100-80GB
    gpus: 2
    mig: [1]
"""
BUDGETS = """\
admins: [root]
policy:
  min_runtime_cap: {interactive: 8h, batch: 2d, debug: 1h}
  whole_gpu_on_mig: false
accounts:
  physics:
    grant: 100
    managers: [alice]
    children:
      lattice: {grant: 60, members: [bob]}
      astro: {grant: 40, members: [dave]}
      scratch: {grant: 0, members: [erin]}
  biology:
    grant: 50
    children:
      genomics: {grant: 50, members: [erin]}
"""
HOUR = 3600.0


@pytest.fixture
def fresh(tmp_path_factory):
    """A hub and a service with an empty ledger: no history of short sessions that would
    make the core predict a running session ends in seconds (and so not preempt it)."""
    from tests.fixtures.hub import start_hub

    h = start_hub(tmp_path_factory.mktemp("freshhub"))
    d = tmp_path_factory.mktemp("fresh")
    (d / "inventory.yaml").write_text(INVENTORY)
    (d / "budgets.yaml").write_text(BUDGETS)
    svc = ServiceProc(h, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    toks = {u: h.token(u) for u in ("root", "erin")}
    yield svc, toks
    cleanup(svc, toks["root"])
    h.stop()


@pytest.fixture(scope="module")
def service(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc")
    (d / "inventory.yaml").write_text(INVENTORY)
    (d / "budgets.yaml").write_text(BUDGETS)
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield svc
    for s in http("GET", f"{svc.api}/sessions?state=pending,running", tokens["root"])[1][
            "sessions"]:
        http("DELETE", f"{svc.api}/sessions/{s['id']}", tokens["root"])
    cleanup(svc, tokens["root"])


def wait_for(fn, what: str, timeout: float = 30.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _event(svc, root, wid, ev, at, **kw):  # noqa: ANN001, ANN201
    st, out = http("POST", f"{svc.api}/usage/events", root,
                   {"workload": wid, "event": ev, "at": at, **kw})
    assert st == 200, out


# ---------------------------------------------------------------- usage per day
def test_daily_usage_splits_at_local_midnight_and_sums_to_the_window_usage(service, tokens):
    root, bob = tokens["root"], tokens["bob"]
    tokyo = ZoneInfo("Asia/Tokyo")
    today = datetime.now(tokyo).date()
    y = today - timedelta(days=1)
    midnight = datetime(y.year, y.month, y.day, tzinfo=tokyo).timestamp()  # yesterday 00:00
    # 2 GPUs from 22:00 the day before yesterday to 03:00 yesterday, Tokyo time
    _event(service, root, "daily-1", "start", midnight - 2 * HOUR, project="lattice",
           user="bob", milli=2000, kind="batch")
    _event(service, root, "daily-1", "stop", midnight + 3 * HOUR)
    posted = time.time()  # a cycle that began after this has seen both events

    st, out = http("GET", f"{service.api}/accounts/lattice/usage/daily?tz=Asia/Tokyo", bob)
    assert st == 200, out
    assert out["account"] == "lattice" and out["tz"] == "Asia/Tokyo"
    assert out["window_s"] == 7 * 24 * HOUR
    days = out["days"]
    assert days[-1]["date"] == today.isoformat()  # the last is today, so far
    assert [d["date"] for d in days] == sorted(d["date"] for d in days)  # oldest first
    assert len(days) == 8  # a 7-day window touches 8 calendar days
    for a, b in zip(days, days[1:], strict=False):
        assert a["end"] == b["start"]  # contiguous
    by_date = {d["date"]: d["gpu_hours"] for d in days}
    assert by_date[(y - timedelta(days=1)).isoformat()] == pytest.approx(4.0)
    assert by_date[y.isoformat()] == pytest.approx(6.0)
    assert by_date[today.isoformat()] == pytest.approx(0.0)
    local_midnight = datetime.fromtimestamp(days[-1]["start"], tokyo)
    assert (local_midnight.hour, local_midnight.minute) == (0, 0)
    assert days[-1]["end"] == pytest.approx(out["computed_at"])

    # the same charge seen from UTC: one day (Tokyo is 9 hours ahead)
    utc = http("GET", f"{service.api}/accounts/lattice/usage/daily?tz=UTC", bob)[1]
    assert sorted(d["gpu_hours"] for d in utc["days"] if d["gpu_hours"])[-1] == \
        pytest.approx(10.0)
    # the parent program counts everything below it; both sum to the window's usage
    physics = http("GET", f"{service.api}/accounts/physics/usage/daily", bob)[1]
    assert physics["tz"] == "UTC"
    assert sum(d["gpu_hours"] for d in physics["days"]) == pytest.approx(10.0)
    # a cycle between the two events counts the charge as still running: wait for one after
    usage = wait_for(lambda: (u := http("GET", f"{service.api}/accounts/lattice/usage", bob)[1])
                     ["computed_at"] > posted and u, "a cycle after both events")
    assert sum(d["gpu_hours"] for d in days) == pytest.approx(usage["usage_hours"], abs=1e-6)


def test_daily_usage_is_seen_only_by_those_who_see_the_account_and_checks_the_zone(
        service, tokens):
    api = f"{service.api}/accounts/lattice/usage/daily"
    assert http("GET", api, tokens["erin"])[0] == 403  # biology only
    assert http("GET", api, tokens["mallory"])[0] == 403
    assert http("GET", api)[0] == 403
    assert http("GET", f"{service.api}/accounts/nope/usage/daily", tokens["root"])[0] == 404
    for bad in ("Mars/Olympus", "../../etc/passwd", "/etc/localtime", "x" * 80, "UTC;1"):
        st, out = http("GET", f"{api}?tz={bad}", tokens["bob"])
        assert st == 400 and out["field"] == "tz", (bad, out)


# ---------------------------------------------------------------- job output
TEXT = "line 1\nGrüße — naïve 東京 ✓\n" + "".join(f"step {i}\n" for i in range(40))


def test_job_log_tail_pages_and_utf8_boundaries(service, tokens):
    bob = tokens["bob"]
    st, job = http("POST", f"{service.api}/jobs", bob, {
        "command": ["python3", "-c", f"import sys; sys.stdout.write({TEXT!r})"],
        "project": "lattice", "gpus": 0, "name": "log-check"})
    assert st == 201, job
    wait_for(lambda: http("GET", f"{service.api}/workloads/{job['id']}", bob)[1]["state"]
             == "done", "the job to finish")
    raw = TEXT.encode()
    api = f"{service.api}/jobs/{job['id']}/log"

    out = http("GET", api, bob)[1]
    assert out["text"] == TEXT and out["size"] == len(raw) and not out["truncated"]
    assert (out["id"], out["attempt"], out["state"]) == (job["id"], 1, "done")
    assert out["offset"] == 0 and out["next_offset"] == len(raw)

    tail = http("GET", f"{api}?limit=20", bob)[1]  # the last 20 bytes
    assert tail["truncated"] and TEXT.endswith(tail["text"]) and tail["next_offset"] == len(raw)
    assert len(tail["text"].encode()) <= 20

    # paging with next_offset reassembles the output exactly, whatever the piece size cuts
    for limit in (1, 5, 7):
        got, offset = [], 0
        while offset < len(raw):
            page = http("GET", f"{api}?offset={offset}&limit={limit}", bob)[1]
            assert page["offset"] == offset and page["size"] == len(raw)
            got.append(page["text"])
            assert "\ufffd" not in page["text"], page
            assert page["next_offset"] > offset or limit < 4, page
            if page["next_offset"] == offset:  # one 4-byte character does not fit: bigger
                page = http("GET", f"{api}?offset={offset}&limit=4", bob)[1]
                got[-1] = page["text"]
            offset = page["next_offset"]
        assert "".join(got) == TEXT, limit
    end = http("GET", f"{api}?offset={len(raw) + 100}", bob)[1]
    assert end["text"] == "" and end["next_offset"] == len(raw)


def test_job_log_is_the_owners_and_checks_its_parameters(service, tokens):
    bob, dave, root = tokens["bob"], tokens["dave"], tokens["root"]
    st, job = http("POST", f"{service.api}/jobs", bob, {
        "command": "echo hello", "project": "lattice", "gpus": 0, "name": "log-auth"})
    assert st == 201, job
    api = f"{service.api}/jobs/{job['id']}/log"
    wait_for(lambda: http("GET", api, bob)[1]["text"] == "hello\n", "the output")
    assert http("GET", api, dave)[0] == 403  # another user
    assert http("GET", api, root)[1]["text"] == "hello\n"  # an admin
    assert http("GET", api)[0] == 403
    assert http("GET", f"{service.api}/jobs/nope/log", bob)[0] == 404
    for q, field in (("limit=0", "limit"), ("limit=2000000", "limit"), ("offset=-1", "offset"),
                     ("offset=x", "offset"), ("attempt=0", "attempt")):
        st, out = http("GET", f"{api}?{q}", bob)
        assert st == 400 and out["field"] == field, (q, out)
    st, out = http("GET", f"{api}?attempt=7", bob)
    assert st == 404 and "no attempt 7" in out["message"]


def test_job_log_of_a_queued_job_is_empty_and_a_planted_link_is_not_followed(service, tokens):
    bob = tokens["bob"]
    secret = service.dir / "secret.txt"
    secret.write_text("the service's own file\n")
    # the job tries to replace its output file by a link to a file of the service: its records
    # are the launcher's (root-owned), so it cannot; the log shows its own output only
    jobs = service.dir / "jobs"
    st, job = http("POST", f"{service.api}/jobs", bob, {
        "command": f"ln -sf {secret} {jobs}/$GPUBUDGET_WORKLOAD/$GPUBUDGET_ATTEMPT/output.log;"
                   " echo rc=$?; sleep 60",
        "project": "lattice", "gpus": 0, "name": "sneaky"})
    assert st == 201, job
    api = f"{service.api}/jobs/{job['id']}/log"
    out = wait_for(lambda: (o := http("GET", api, bob)[1]).get("text", "").count("rc=") and o,
                   "the job's output")
    assert "rc=1" in out["text"] and "service's own" not in out["text"], out
    assert not os.path.islink(jobs / job["id"] / "1" / "output.log")
    http("DELETE", f"{service.api}/jobs/{job['id']}", bob)

    # the whole GPU is held by a protected session: a one-GPU job waits, with no output yet
    root = tokens["root"]
    st, holder = http("POST", f"{service.api}/sessions", root, {
        "user": "erin", "project": "genomics", "slice": "gpu:1", "min_runtime": "1h"})
    assert st == 201, holder
    wait_for(lambda: http("GET", f"{service.api}/sessions/{holder['id']}", root)[1]["state"]
             == "running", "the session to run")
    st, queued = http("POST", f"{service.api}/jobs", bob, {
        "command": "echo never", "project": "lattice", "gpus": 1, "name": "waiting"})
    assert st == 201, queued
    time.sleep(1.5)  # cycles pass; it stays queued
    out = http("GET", f"{service.api}/jobs/{queued['id']}/log", bob)[1]
    assert (out["attempt"], out["text"], out["size"], out["state"]) == (0, "", 0, "pending")
    http("DELETE", f"{service.api}/jobs/{queued['id']}", bob)
    http("DELETE", f"{service.api}/sessions/{holder['id']}", root)


# ---------------------------------------------------------------- sessions
def _session(svc, token, **body) -> dict:  # noqa: ANN001
    st, s = http("POST", f"{svc.api}/sessions", token, body)
    assert st == 201, s
    return s


def _state(svc, token, sid, state):  # noqa: ANN001, ANN201
    return wait_for(lambda: (s := http("GET", f"{svc.api}/sessions/{sid}", token)[1])["state"]
                    == state and s, f"session {sid} {state}")


def test_queued_session_is_told_which_slices_would_start_now(service, tokens):
    root = tokens["root"]
    big = _session(service, root, user="erin", project="genomics", slice="gpu:1",
                   min_runtime="1h")
    _state(service, root, big["id"], "running")
    waiting = _session(service, root, user="dave", project="astro", slice="gpu:1",
                       min_runtime="1h")
    s = wait_for(lambda: (s := http("GET", f"{service.api}/sessions/{waiting['id']}",
                                    tokens["dave"])[1])["queue_position"] and s, "queued")
    assert s["state"] == "pending"
    keys = [f["key"] for f in s["free_now"]]
    # MIG instances, and MPS shares (which would start as MIG instances: no GPU outside MIG
    # mode has room); never the whole GPU it waits for
    assert keys and all(k.startswith(("mig:", "mps:")) for k in keys), s["free_now"]
    assert "mig:7g.80gb" in keys and "mps:250" in keys and "gpu:1" not in keys
    fractions = [f["fraction"] for f in s["free_now"]]
    assert fractions == sorted(fractions, reverse=True)  # largest first
    assert s["free_now"][0]["label"].startswith("MIG 7g.80gb")
    # each one really would start: queue it and it runs
    alt = _session(service, root, user="dave", project="astro", slice=keys[-1],
                   min_runtime="1h")
    _state(service, root, alt["id"], "running")
    # a running session has no such list
    assert "free_now" not in http("GET", f"{service.api}/sessions/{alt['id']}", root)[1]
    for sid in (alt["id"], waiting["id"], big["id"]):
        http("DELETE", f"{service.api}/sessions/{sid}", root)


def test_preempted_session_says_when_its_server_will_be_stopped(fresh):
    service, tokens = fresh
    root = tokens["root"]
    # unbacked (its project has no grant), on the whole GPU
    victim = _session(service, root, user="erin", project="scratch", slice="gpu:1",
                      min_runtime="1h")
    v = _state(service, root, victim["id"], "running")
    assert v["preempt_deadline"] is None and v["preempt_requested"] is None
    time.sleep(1)
    v = http("GET", f"{service.api}/sessions/{victim['id']}", root)[1]
    ran = time.time() - v["started_at"]
    assert v["charged_gpu_hours"] == pytest.approx(ran / 3600, abs=0.5 / 3600)  # 1 GPU
    # backed work wants the GPU: the scheduler asks for the unbacked session to stop
    _session(service, root, user="bob", project="lattice", slice="gpu:1", min_runtime="1h")
    s = wait_for(lambda: (s := http("GET", f"{service.api}/sessions/{victim['id']}",
                                    tokens["erin"])[1])["preempt_requested"] and s,
                 "the preemption request")
    led = Ledger(connect(service.db_url, read_only=True))
    asked = [d for d in led.decisions(workloads=[victim["id"]]) if d.kind == "preempt-requested"]
    assert s["preempt_deadline"] == pytest.approx(asked[-1].at + 120.0)  # Policy.stop_grace
    assert s["preempt_deadline"] > time.time()
    for w in http("GET", f"{service.api}/sessions?state=pending,running", root)[1]["sessions"]:
        http("DELETE", f"{service.api}/sessions/{w['id']}", root)


def test_one_quote_for_the_spawn_form(service, tokens):
    bob = tokens["bob"]
    st, q = http("GET", f"{service.api}/sessions/quote?project=lattice&slice=mig:3g.40gb"
                        "&min_runtime=2h", bob)
    assert st == 200, q
    assert (q["user"], q["project"], q["slice"], q["min_runtime"]) == \
        ("bob", "lattice", "mig:3g.40gb", 7200)
    assert q["min_runtime_cap"] == 8 * HOUR
    assert q["quote"]["starts_now"] and q["quote"]["backed"]
    assert q["quote"]["protected_s"] == 7200
    assert q["quote"]["cost_gpu_hours"] == pytest.approx(3 / 7 * 2, abs=1e-3)
    st, out = http("GET", f"{service.api}/sessions/quote?project=astro&slice=cpu", bob)
    assert st == 403 and "not a member of project 'astro'" in out["message"]
    for q, field in (("project=lattice&slice=tpu:1", "slice"),
                     ("project=lattice&slice=mig:9g.99gb", "slice"),
                     ("project=lattice&min_runtime=soon", "min_runtime"),
                     ("slice=cpu", "project")):
        st, out = http("GET", f"{service.api}/sessions/quote?{q}", bob)
        assert st == 400 and out["field"] == field, (q, out)
    # acting for someone else needs the admin scope
    assert http("GET", f"{service.api}/sessions/quote?user=dave&project=astro", bob)[0] == 403
    st, q = http("GET", f"{service.api}/sessions/quote?user=dave&project=astro&slice=gpu:1",
                 tokens["root"])
    assert st == 200 and q["user"] == "dave"


def test_offer_carries_each_projects_budget_figures(service, tokens):
    st, offer = http("GET", f"{service.api}/sessions/offer?quotes=0", tokens["bob"])
    assert st == 200, offer
    f = offer["figures"]["lattice"]
    a = http("GET", f"{service.api}/accounts/lattice", tokens["bob"])[1]
    assert f["grant_hours"] == pytest.approx(a["effective_grant_hours"])
    assert f["usage_hours"] == pytest.approx(a["usage_hours"], abs=0.01)
    assert f["left_hours"] == pytest.approx(f["grant_hours"] - f["usage_hours"])
    assert f["parent"] == "physics"


def test_the_api_document_lists_the_new_paths(service):
    paths = http("GET", f"{service.api}/openapi.json")[1]["paths"]
    for p in ("/accounts/{name}/usage/daily", "/jobs/{name}/log", "/sessions/quote"):
        assert p in paths
