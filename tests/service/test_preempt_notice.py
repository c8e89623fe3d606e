"""Warned ahead, against the real service (a real process registered with a real JupyterHub):
bob's protected session runs on n1 when the admins drain n1. Before anything stops, the
session's JSON forecasts its preemption at the end of its protection ("its node n1 is being
drained") and bob gets a notice in words ahead; when the core asks for the session, the
server is not stopped at once: the session carries ``preempt_stop_at`` (the lab's notice,
``preempt_notice_time``), and "Save and release now" (``POST /sessions/{id}/release``, the
owner only; 409 when nothing is being preempted) brings it forward to now. The test plays
the hub's part for the session (heartbeats, ending it)."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.hub import ServiceProc, http

from .conftest import cleanup
from .test_drain import get, health, until

INVENTORY = """\
nodes:
  - {name: n1, model: H100-80GB, gpus: 1}
"""
PROTECT_S = 8
NOTICE_S = 30


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("notice")
    (d / "inventory.yaml").write_text(INVENTORY)
    s = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", cycle_interval=0.5,
                    extra_args=["--GpuBudgetService.health_interval=0.5",
                                "--GpuBudgetService.forecast_min_interval=0.5",
                                "--GpuBudgetService.preemption_outlook_interval=0.5",
                                f"--GpuBudgetService.preempt_notice_time={NOTICE_S}",
                                "--LocalBackend.stop_grace=2"])
    s.start()
    yield s
    cleanup(s, tokens["root"])


def test_a_drained_session_is_forecast_warned_and_given_the_labs_notice(svc, tokens):
    root, bob, dave = tokens["root"], tokens["bob"], tokens["dave"]
    st, sess = http("POST", svc.api + "/sessions", root,
                    {"user": "bob", "project": "lattice", "gpus": 1,
                     "min_runtime": f"{PROTECT_S}s"})
    assert st == 201, sess
    sid = sess["id"]
    s = until(lambda: (w := get(svc, f"/sessions/{sid}", bob))["state"] == "running" and w,
              "session starts")
    assert s["preemption_forecast"]["likely"] is False
    assert s["preempt_stop_at"] is None
    st, body = http("POST", f"{svc.api}/sessions/{sid}/release", bob)
    assert st == 409 and "not being preempted" in body["message"]

    health(svc, "n1", root, False, "fan failure")
    s = until(lambda: (w := get(svc, f"/sessions/{sid}", bob))["preemption_forecast"]["likely"]
              and w, "forecast", timeout=10)
    fc = s["preemption_forecast"]
    assert fc["at"] == pytest.approx(s["protected_until"], abs=0.5)
    assert fc["reason"] == "its node n1 is being drained for maintenance"
    assert fc["for_workload"] is None and fc["at_text"]
    assert s["state"] == "running" and not s["preempt_requested"]  # nothing happened yet
    # told ahead, in words
    n = until(lambda: [x for x in get(svc, "/notices", bob)["notices"]
                       if x["kind"] == "preempt-warning"], "warning notice", timeout=10)[0]
    assert n["title"].startswith("Your server (project lattice) may be stopped at ")
    assert "its node n1 is being drained for maintenance" in n["body"]
    assert "Save your notebooks now" in n["body"] and sid not in n["body"]

    def asked() -> dict | None:
        b = http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root)[1]
        return b if b.get("preempt_requested") else None

    hb = until(asked, "session asked to stop", timeout=PROTECT_S + 15, every=0.2)
    requested = hb["preempt_deadline"] - 120.0  # the policy's stop grace
    assert hb["preempt_stop_at"] == pytest.approx(requested + NOTICE_S, abs=0.01)
    # only its owner releases it
    st, _ = http("POST", f"{svc.api}/sessions/{sid}/release", dave)
    assert st == 403
    t = time.time()
    st, out = http("POST", f"{svc.api}/sessions/{sid}/release", bob)
    assert st == 200, out
    assert requested <= out["preempt_stop_at"] <= time.time() + 0.01
    assert out["preempt_stop_at"] >= t - 1
    rel = get(svc, f"/decisions?kind=release-now&workload={sid}", root)["decisions"]
    assert [d["actor"] for d in rel] == ["bob"]
    st, _ = http("DELETE", f"{svc.api}/sessions/{sid}?reason=preempt", root)
    assert st == 200
    health(svc, "n1", root, True, "fan replaced")
