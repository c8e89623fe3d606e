"""The sidebar's own figures through the real service and hub: ``GET /me/week`` (my GPU-hours
this week, charged and busy, per project, my own line only) and ``GET /sessions/{id}/
utilisation`` (my session's live GPU utilisation from its latest busy sample; unknown where
nothing measured it), with who may read what and a bad zone's 400."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from tests.fixtures.hub import BUDGETS, ServiceProc, http
from tests.service.conftest import cleanup

BERLIN = ZoneInfo("Europe/Berlin")
IDS: dict[str, str] = {}


def _week_start(now: float) -> float:
    d = datetime.fromtimestamp(now, BERLIN).date()
    d -= timedelta(days=d.weekday())
    return datetime(d.year, d.month, d.day, tzinfo=BERLIN).timestamp()


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _history(url: str, now: float) -> None:
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(BUDGETS), now=now - 30 * 86400)
    runs = [  # (user, project, gpu, start, end, busy)
        ("bob", "lattice", 0, now - 10 * 86400, now - 10 * 86400 + 3600, 0.5),  # last week
        ("bob", "lattice", 0, now - 3 * 3600, now - 1 * 3600, 0.9),
        ("dave", "astro", 1, now - 3 * 3600, now - 2 * 3600, 0.1),
    ]
    for user, project, gpu, a, b, busy in runs:
        w = led.submit(project=project, user=user, kind="batch", now=a - 60,
                       request={"kind": "gpu", "gpus": 1})
        led.start(w.id, placement=[{"node": "n9", "gpu": gpu, "milli": 1000}], milli=1000,
                  backed=True, protected_until=None, now=a)
        led.record_busy([(w.id, a, b, busy, "device")])
        led.stop(w.id, now=b, state="done", closed_by="exit")
    # bob's notebook session on half a GPU, sampled 37 % busy a moment ago (it ended just
    # now: the service does not manage it, so nothing else changes its figures)
    s = led.submit(project="lattice", user="bob", kind="interactive", now=now - 1900,
                   request={"kind": "gpu", "gpus": 1})
    led.start(s.id, placement=[{"node": "n9", "gpu": 2, "milli": 500}], milli=500, backed=True,
              protected_until=None, now=now - 1800)
    led.record_busy([(s.id, now - 1800, now - 40, 0.8, "device")])
    led.record_busy([(s.id, now - 40, now - 10, 0.37, "device")])
    led.stop(s.id, now=now - 5, state="done", closed_by="exit")
    IDS["session"] = s.id
    # a session nothing measures (a declared inventory): unknown
    u = led.submit(project="lattice", user="bob", kind="interactive", now=now - 700,
                   request={"kind": "gpu", "gpus": 1})
    led.start(u.id, placement=[{"node": "n9", "gpu": 3, "milli": 1000}], milli=1000,
              backed=True, protected_until=None, now=now - 600)
    led.stop(u.id, now=now - 5, state="done", closed_by="exit")
    IDS["unmeasured"] = u.id
    led.dispose()


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc-myweek")
    url = f"sqlite:///{d / 'ledger.sqlite'}"
    IDS["now"] = time.time()  # type: ignore[assignment]
    _history(url, IDS["now"])  # type: ignore[arg-type]
    s = ServiceProc(hub, d, url)
    s.start()
    yield s
    cleanup(s, None)


def test_my_week_is_my_own_line_charged_and_busy(svc, tokens):
    now0: float = IDS["now"]  # type: ignore[assignment]
    status, body = http("GET", f"{svc.api}/me/week?tz=Europe/Berlin", tokens["bob"])
    assert status == 200, body
    lo = _week_start(now0)
    assert body["from"] == pytest.approx(lo)
    assert datetime.fromisoformat(body["from_local"]).weekday() == 0
    now = body["to"]
    assert [p["project"] for p in body["projects"]] == ["lattice"]  # not dave's astro
    lattice = body["projects"][0]
    job = _overlap(now0 - 3 * 3600, now0 - 3600, lo, now)
    sessions = (0.5 * _overlap(now0 - 1800, now0 - 5, lo, now)
                + _overlap(now0 - 600, now0 - 5, lo, now))
    assert lattice["charged_gpu_h"] == pytest.approx((job + sessions) / 3600, abs=1e-6)
    measured = job + 0.5 * _overlap(now0 - 1800, now0 - 10, lo, now)
    busy = 0.9 * job + 0.5 * (0.8 * _overlap(now0 - 1800, now0 - 40, lo, now)
                              + 0.37 * _overlap(now0 - 40, now0 - 10, lo, now))
    assert lattice["measured_gpu_h"] == pytest.approx(measured / 3600, abs=1e-3)
    assert lattice["busy_gpu_h"] == pytest.approx(busy / 3600, abs=1e-3)
    assert body["totals"]["charged_gpu_h"] == pytest.approx(lattice["charged_gpu_h"])
    assert body["totals"]["busy_gpu_h"] == pytest.approx(lattice["busy_gpu_h"])
    # dave: his own hour at 10 %, nothing of bob's
    status, body = http("GET", f"{svc.api}/me/week", tokens["dave"])
    assert status == 200 and [p["project"] for p in body["projects"]] == ["astro"]
    astro = body["projects"][0]
    hour = _overlap(now0 - 3 * 3600, now0 - 2 * 3600, _week_start(now0), body["to"]) / 3600
    assert astro["charged_gpu_h"] == pytest.approx(hour, abs=1e-6)
    # nothing of erin's measured (nothing ran): busy unknown, not 0
    status, body = http("GET", f"{svc.api}/me/week", tokens["erin"])
    assert status == 200 and [p["project"] for p in body["projects"]] == ["genomics"]
    assert body["projects"][0]["charged_gpu_h"] == 0
    assert body["projects"][0]["busy_gpu_h"] is None and body["totals"]["busy_gpu_h"] is None


def test_a_bad_zone_is_400_naming_it(svc, tokens):
    status, body = http("GET", f"{svc.api}/me/week?tz=Mars/Olympus", tokens["bob"])
    assert status == 400 and body["field"] == "tz"


def test_live_utilisation_from_the_latest_sample_or_unknown(svc, tokens):
    status, body = http("GET", f"{svc.api}/sessions/{IDS['session']}/utilisation",
                        tokens["bob"])
    assert status == 200, body
    assert body["status"] == ("live" if body["age_s"] <= body["max_age_s"] else "stale")
    assert body["source"] == "device"
    assert body["utilisation"] == pytest.approx(0.37)
    assert body["at"] == pytest.approx(IDS["now"] - 10)  # type: ignore[operator]
    assert 0.37 < body["average"] < 0.8
    status, body = http("GET", f"{svc.api}/sessions/{IDS['unmeasured']}/utilisation",
                        tokens["bob"])
    assert status == 200 and body["status"] == "unknown" and body["utilisation"] is None
    assert "unknown" in body["message"]
    # another user's session: 403; no such session: 404
    status, body = http("GET", f"{svc.api}/sessions/{IDS['session']}/utilisation",
                        tokens["dave"])
    assert status == 403
    status, _ = http("GET", f"{svc.api}/sessions/nosuch/utilisation", tokens["bob"])
    assert status == 404
    status, body = http("GET", f"{svc.api}/openapi.json")
    assert {"/me/week", "/sessions/{id}/utilisation"} <= set(body["paths"])
