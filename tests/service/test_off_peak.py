"""Off-peak prices against the real service process and the local backend: the spawn form's
quote and ``gpubudget submit --dry-run`` show the price now and the cheaper start; a job that
asks ``start: off-peak`` waits for the window (shown as waiting for it, not queued for GPUs)
and starts once it has begun; a bad ``start`` is refused (400 naming it, nothing queued).

The service reads the real clock: the policy's window starts at the next whole minute (UTC)
at least 40 s ahead, so the waiting job is seen waiting and then starting within 40 to 100 s."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest

from jupyter_gpubudget.cli import main
from tests.fixtures.hub import BUDGETS, ServiceProc, http
from tests.service.conftest import cleanup
from tests.service.test_api import get_w, wait_for


@pytest.fixture(scope="module")
def off_peak(hub, tokens, tmp_path_factory):  # noqa: ANN001, ANN201
    """The service with an off-peak window (factor 0.5, UTC) from the next whole minute on for
    six hours, one pending workload per user; yields (service, the window's start)."""
    d = tmp_path_factory.mktemp("svc-offpeak")
    start = math.ceil((time.time() + 40) / 60) * 60  # room for a slow start under load
    a = datetime.fromtimestamp(start, UTC)
    b = datetime.fromtimestamp(start + 6 * 3600, UTC)
    (d / "budgets.yaml").write_text(BUDGETS.replace("policy:\n", (
        "policy:\n  max_pending_per_user: 1\n"
        "  off_peak:\n    timezone: UTC\n    factor: 0.5\n"
        f"    windows: [\"Mon-Sun {a:%H:%M}-{b:%H:%M}\"]\n"), 1))
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield svc, float(start)
    cleanup(svc, tokens["root"])


def test_the_quote_shows_the_price_now_and_the_cheaper_start(off_peak, tokens):  # noqa: ANN001
    svc, start = off_peak
    at = datetime.fromtimestamp(start, UTC).strftime("%H:%M")
    st, out = wait_for(lambda: (r := http(
        "GET", f"{svc.api}/sessions/quote?project=lattice&gpus=1&min_runtime=2h",
        tokens["bob"]))[0] != 503 and r, "a first cycle")
    assert st == 200, out
    price = out["quote"]["price"]
    assert price["factor_now"] == 1.0 and price["next_off_peak"] == start
    assert price["text"] == f"now: 1.0× — start after {at} UTC for 0.5× (half the cost)"
    # two hours of one GPU: 1 GPU-h from the window's start, more from now (its first
    # seconds at the full price)
    assert price["run_off_peak_gpu_hours"] == 1.0
    assert 1.0 < price["run_gpu_hours"] < 1.1


def test_submit_dry_run_shows_the_price_and_submits_nothing(off_peak, tokens, tmp_path, capsys):  # noqa: ANN001
    svc, start = off_peak
    at = datetime.fromtimestamp(start, UTC).strftime("%H:%M")
    before = http("GET", svc.api + "/jobs", tokens["bob"])[1]["jobs"]
    job = tmp_path / "job.yaml"
    job.write_text("command: 'true'\nproject: lattice\ngpus: 1\ntime_limit: 4h\n")
    wait_for(lambda: http("GET", f"{svc.api}/sessions/quote?project=lattice",
                          tokens["bob"])[0] == 200, "a first cycle")
    rc = main(["submit", f"--url={svc.base}", f"--token={tokens['bob']}", "--dry-run",
               str(job)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    lines = out.out.splitlines()
    assert lines[0].startswith("dry run: nothing submitted. lattice: ")
    assert lines[1] == f"now: 1.0× — start after {at} UTC for 0.5× (half the cost)"
    assert lines[2].endswith(f"GPU-h now, 2.00 GPU-h from {at} (start: off-peak waits for it)")
    assert http("GET", svc.api + "/jobs", tokens["bob"])[1]["jobs"] == before


def test_a_bad_start_is_refused_naming_it(off_peak, tokens):  # noqa: ANN001
    svc, _ = off_peak
    before = [j["id"] for j in http("GET", svc.api + "/jobs", tokens["bob"])[1]["jobs"]]
    st, out = http("POST", svc.api + "/jobs", tokens["bob"],
                   {"command": "true", "project": "lattice", "start": "tonight"})
    assert st == 400 and out["field"] == "start", out
    assert "expected 'now' (the default) or 'off-peak'" in out["message"]
    assert [j["id"] for j in http("GET", svc.api + "/jobs", tokens["bob"])[1]["jobs"]] == before


def test_an_off_peak_job_waits_for_the_window_then_runs(off_peak, tokens):  # noqa: ANN001
    svc, start = off_peak
    bob = tokens["bob"]
    at = datetime.fromtimestamp(start, UTC).strftime("%a %H:%M UTC")
    st, job = http("POST", svc.api + "/jobs", bob,
                   {"command": "true", "project": "lattice", "gpus": 1, "start": "off-peak"})
    assert st == 201, job
    assert job["start_after"] == start
    # an ordinary job submitted after it starts at once: the waiting one holds no GPU, and
    # is not counted as queued (one pending job allowed here: max_pending_per_user 1)
    st, now_job = http("POST", svc.api + "/jobs", bob,
                       {"command": "true", "project": "lattice", "gpus": 2})
    assert st == 201, now_job
    w = wait_for(lambda: (w := get_w(svc, bob, job["id"]))["waiting_for"] and w,
                 "the off-peak job to be shown waiting")
    assert w["waiting_for"] == f"waiting for the off-peak window ({at})"
    assert w["state"] == "pending" and w["queue_position"] is None
    # the queue page says why it waits (not a rank among the work queued for GPUs)
    entry = next(e for e in http("GET", svc.api + "/queue/detail", bob)[1]["pending"]
                 if e["id"] == job["id"])
    assert (entry["why"], entry["why_text"], entry["position"]) == (
        "off-peak", f"waiting for the off-peak window ({at})", None)
    first = wait_for(lambda: (w := get_w(svc, bob, now_job["id"]))["state"] == "done" and w,
                     "the ordinary job to run", timeout=60)
    done = wait_for(lambda: (w := get_w(svc, bob, job["id"]))["state"] == "done" and w,
                    "the off-peak job to run once its window began", timeout=150)
    assert done["started_at"] >= start and done["exit_code"] == 0
    assert first["started_at"] < done["started_at"]  # it did not wait behind the held job
