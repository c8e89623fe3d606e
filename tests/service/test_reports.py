"""``GET /api/v1/reports`` through the real service and hub: a month of history (longer than
the 7-day usage window) written to the ledger before the service starts, read back as JSON
and CSV; bad periods, zones and accounts; who sees what (admin, manager, researcher)."""

from __future__ import annotations

import csv
import io
import time
import urllib.request
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from tests.fixtures.hub import BUDGETS, ServiceProc, http
from tests.service.conftest import cleanup

DAYS = 30
EVIL = "=HYPERLINK(\"http://x\")"  # a user name a spreadsheet would run as a formula
BERLIN = ZoneInfo("Europe/Berlin")


def _history(url: str) -> None:
    upgrade(url)
    led = Ledger(connect(url))
    led.sync_budgets(load_budgets(BUDGETS), now=time.time())
    today = datetime.now(BERLIN).replace(hour=0, minute=0, second=0, microsecond=0)
    for d in range(DAYS, 0, -1):  # oldest first, as they happened
        day = (today - timedelta(days=d)).timestamp()
        for gpu, (user, project, hours, busy) in enumerate((
                ("bob", "lattice", 1, 0.9), (EVIL, "lattice", 1, 0.5), ("dave", "astro", 2, None))):
            start = day + 9 * 3600
            w = led.submit(project=project, user=user, kind="batch", now=start - 60,
                           request={"kind": "gpu", "gpus": 1})
            led.start(w.id, placement=[{"node": "n0", "gpu": gpu, "milli": 1000}],
                      milli=1000, backed=True, protected_until=None, now=start)
            if busy is not None:
                led.record_busy([(w.id, start, start + hours * 3600, busy, "device")])
            led.stop(w.id, now=start + hours * 3600, state="done", closed_by="exit")
    led.dispose()


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc-reports")
    url = f"sqlite:///{d / 'ledger.sqlite'}"
    _history(url)
    s = ServiceProc(hub, d, url)
    s.start()
    yield s
    cleanup(s, tokens["root"])


def _span() -> dict:
    today = datetime.now(BERLIN).date()
    return {"from": (today - timedelta(days=DAYS + 1)).isoformat(),
            "to": today.isoformat(), "tz": "Europe/Berlin"}


def get(svc, token, **params):  # noqa: ANN001, ANN003, ANN201
    q = "&".join(f"{k}={urllib.request.quote(str(v))}" for k, v in params.items())
    return http("GET", f"{svc.api}/reports?{q}", token)


def test_a_month_of_history_past_the_window_with_busy_unknown_where_unmeasured(svc, tokens):
    st, r = get(svc, tokens["root"], account="physics", by="user", **_span())
    assert st == 200, r
    p = {e["project"]: e for e in r["projects"]}
    assert p["lattice"]["charged_gpu_h"] == pytest.approx(2 * DAYS)
    assert p["lattice"]["busy_gpu_h"] == pytest.approx(1.4 * DAYS)
    users = {u["user"]: u for u in p["lattice"]["users"]}
    assert users["bob"]["busy_gpu_h"] == pytest.approx(0.9 * DAYS)
    assert users["bob"]["idle_share"] == pytest.approx(0.1)
    assert p["astro"]["charged_gpu_h"] == pytest.approx(2 * DAYS)
    assert p["astro"]["busy_gpu_h"] is None  # nothing measured it: unknown, not 0
    assert r["totals"]["charged_gpu_h"] == pytest.approx(4 * DAYS)
    assert r["totals"]["measured_gpu_h"] == pytest.approx(2 * DAYS)
    assert r["waits"]["batch"]["count"] == 3 * DAYS
    assert r["waits"]["batch"]["p50_s"] == pytest.approx(60, rel=0.2)  # half an octave
    # the usage window (7 days) holds far less than the report
    st, u = http("GET", f"{svc.api}/accounts/lattice/usage", tokens["root"])
    assert st == 200


def test_csv_reads_back_formula_safe_and_sums_equal_the_json(svc, tokens):
    st, r = get(svc, tokens["root"], account="physics", by="day", **_span())
    assert st == 200 and len(r["periods"]) == DAYS
    req = urllib.request.Request(
        f"{svc.api}/reports?account=physics&by=day&format=csv&from={_span()['from']}"
        f"&to={_span()['to']}&tz=Europe/Berlin")
    req.add_header("Authorization", f"token {tokens['root']}")
    with urllib.request.urlopen(req) as resp:
        assert resp.headers["Content-Type"].startswith("text/csv")
        text = resp.read().decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert not any(v.startswith(("=", "+", "-", "@")) for row in rows for v in row.values())
    evil = [x for x in rows if x["row"] == "user" and EVIL in x["user"]]
    assert evil and evil[0]["user"] == "'" + EVIL
    total = [x for x in rows if x["row"] == "total"][0]
    assert float(total["charged_gpu_h"]) == pytest.approx(r["totals"]["charged_gpu_h"])
    for kind in ("period", "user", "project"):
        assert sum(float(x["charged_gpu_h"]) for x in rows if x["row"] == kind) == \
            pytest.approx(r["totals"]["charged_gpu_h"])
    assert sum(float(x["busy_gpu_h"] or 0) for x in rows if x["row"] == "project") == \
        pytest.approx(r["totals"]["busy_gpu_h"])


@pytest.mark.parametrize(("params", "field"), [
    ({"account": "physics", "from": "2025-13-01", "to": "2025-01-02"}, "from"),
    ({"account": "physics", "from": "2025-03-02", "to": "2025-03-01"}, "to"),
    ({"account": "physics", "from": "2000-01-01", "to": "2025-01-01"}, "to"),
    ({"account": "physics", "from": "2025-03-01"}, "to"),
    ({"account": "physics", "period": "year"}, "period"),
    ({"account": "physics", "period": "day", "at": "yesterday"}, "at"),
    ({"account": "physics", "period": "week", "tz": "Mars/Olympus"}, "tz"),
    ({"account": "physics", "period": "week", "tz": "../../etc/passwd"}, "tz"),
    ({"account": "nosuch", "period": "week"}, "account"),
    ({"period": "week"}, "account"),
    ({"account": "physics", "period": "week", "by": "month"}, "by"),
    ({"account": "physics", "period": "week", "format": "xml"}, "format"),
])
def test_bad_periods_zones_and_accounts_are_400_with_the_reason(svc, tokens, params, field):
    st, r = get(svc, tokens["root"], **params)
    assert st == 400, r
    assert r.get("field") == field and r.get("message"), r


def test_who_sees_what(svc, tokens):
    span = _span()
    # an admin: everything
    st, r = get(svc, tokens["root"], account="biology", **span)
    assert st == 200
    # a manager: their subtree, every line
    st, r = get(svc, tokens["alice"], account="physics", **span)
    assert st == 200 and {p["project"] for p in r["projects"]} == {"lattice", "astro"}
    assert {u["user"] for p in r["projects"] for u in p["users"]} == {"bob", EVIL, "dave"}
    assert r["totals"]["grant_gpu_h"] is not None
    st, r = get(svc, tokens["alice"], account="biology", **span)
    assert st == 403
    # a researcher: their own projects' totals and their own line only
    st, r = get(svc, tokens["bob"], account="physics", by="day", **span)
    assert st == 200 and [p["project"] for p in r["projects"]] == ["lattice"]
    assert r["projects"][0]["charged_gpu_h"] == pytest.approx(2 * DAYS)  # the project's
    assert [u["user"] for u in r["projects"][0]["users"]] == ["bob"]
    assert sum(e["charged_gpu_h"] for per in r["periods"] for e in per["projects"]) == \
        pytest.approx(DAYS)  # the series: their own use
    assert r["totals"]["grant_gpu_h"] is None  # the program's grant is not theirs to see
    for account in ("astro", "biology", "genomics"):
        assert get(svc, tokens["bob"], account=account, **span)[0] == 403
    assert get(svc, tokens["mallory"], account="physics", **span)[0] == 403
    assert http("GET", f"{svc.api}/reports?account=physics&period=week")[0] in (401, 403)


def test_the_openapi_document_lists_reports(svc):
    st, doc = http("GET", f"{svc.api}/openapi.json")
    assert st == 200 and "/reports" in doc["paths"]


def test_gpubudget_report_prints_the_table_and_writes_csv_and_png(svc, tokens, tmp_path, capsys):
    from jupyter_gpubudget.cli import main

    span = _span()
    png, out_csv = tmp_path / "report.png", tmp_path / "report.csv"
    rc = main(["report", "physics", f"--from={span['from']}", f"--to={span['to']}",
               "--tz=Europe/Berlin", "--by=user", f"--csv={out_csv}", f"--plot={png}",
               f"--url={svc.base}", f"--token={tokens['root']}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "lattice" in out and "astro" in out and "bob" in out and "unknown" in out
    assert f"{2 * DAYS:,.1f}" in out  # lattice's charged GPU-h
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [x for x in rows if x["row"] == "total"]
    # refusals are said, with the service's reason
    rc = main(["report", "physics", "--from=2025-03-02", "--to=2025-03-01",
               f"--url={svc.base}", f"--token={tokens['root']}"])
    assert rc == 1 and "ends before it starts" in capsys.readouterr().err
    rc = main(["report", "biology", "--period=week", f"--url={svc.base}",
               f"--token={tokens['bob']}"])
    assert rc == 1 and "403" in capsys.readouterr().err
