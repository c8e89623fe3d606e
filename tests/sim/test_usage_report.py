"""`gpubudget simulate --report`: the usage report for a simulated period in the service's
report's columns (``usage_report.py``), its sums, busy time from the trace's ``busy`` column
(unknown where a trace has none), and each member's share inside a project
(``sim/usage.py``)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from jupyter_gpubudget.cli.simulate import add_simulate_parser
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.reports import Scope, report
from jupyter_gpubudget.sim.traces import TraceError, parse_native
from jupyter_gpubudget.usage_report import csv_text

BUDGETS = """
admins: [root]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 60, members: [bob, carol]}
      astro: {grant: 40, members: [dave]}
"""
# two GPUs, nothing waits: bob holds 3 GPU-h (90 % busy), carol 1 GPU-h (10 % busy), dave
# 2 GPU-h (busy unknown: the row leaves it empty)
TRACE = """id,submit,duration,gpus,project,user,kind,busy
b1,0,1h,1,lattice,bob,batch,0.9
b2,3600,2h,1,lattice,bob,batch,0.9
c1,0,1h,1,lattice,carol,interactive,0.1
d1,3600,2h,1,astro,dave,batch,
"""


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpubudget")
    sub = p.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    args = p.parse_args(["simulate", *argv])
    return int(args.func(args))


def simulate_report(tmp_path: Path, name: str, *extra: str) -> Path:
    out = tmp_path / name
    assert run([*extra, "--out", str(tmp_path / "out"), "--no-plots", "--quiet",
                "--report", str(out)]) == 0
    return out


def handmade(tmp_path: Path, name: str) -> Path:
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "budgets.yaml").write_text(BUDGETS)
    return simulate_report(tmp_path, name, "--trace", str(tmp_path / "trace.csv"),
                           "--budgets", str(tmp_path / "budgets.yaml"), "--gpus", "2")


def service_report(tmp_path: Path) -> dict:
    """The service's report over a real (SQLite) ledger: two users' charge intervals, one
    with busy samples."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    upgrade(url)
    led = Ledger(connect(url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), now=1.0)
        t0 = 1_750_000_000.0 - 1_750_000_000.0 % 86400
        for user, project, gpu, busy in (("bob", "lattice", 0, 0.9), ("dave", "astro", 1, None)):
            w = led.submit(project=project, user=user, kind="batch",
                           request={"kind": "gpu", "gpus": 1}, now=t0)
            led.start(w.id, placement=[{"node": "n1", "gpu": gpu, "milli": 1000}], milli=1000,
                      backed=True, protected_until=None, now=t0 + 60)
            if busy is not None:
                led.record_busy([(w.id, t0 + 60, t0 + 3660, busy, "device")])
            led.stop(w.id, now=t0 + 3660, state="done", closed_by="exit")
        with led.ro() as s:
            return report(s, account="physics", scope=Scope(["astro", "lattice"]), start=t0,
                          end=t0 + 86400, tz=ZoneInfo("UTC"), by="user", now=t0 + 86400,
                          grants={"physics": 100.0, "lattice": 60.0, "astro": 40.0},
                          window=7 * 86400.0)
    finally:
        led.dispose()


def test_simulate_report_has_the_service_reports_columns_and_lines(tmp_path: Path) -> None:
    svc = service_report(tmp_path)
    sim_csv = handmade(tmp_path, "sim.csv").read_text()
    sim = json.loads(handmade(tmp_path, "sim.json").read_text())
    # the CSV: the same header as the service's, the same kinds of rows
    svc_rows = list(csv.reader(io.StringIO(csv_text(svc))))
    sim_rows = list(csv.reader(io.StringIO(sim_csv)))
    assert sim_rows[0] == svc_rows[0]
    assert {r[0] for r in sim_rows[1:]} == {r[0] for r in svc_rows[1:]} == {
        "user", "project", "total"}
    # the JSON: the same keys in every project, user and total line, and at the top
    assert set(sim["totals"]) == set(svc["totals"])
    for key in ("projects", "waits", "idle_sessions"):
        assert key in sim
    assert set(svc) <= set(sim)
    for sp, vp in zip(sim["projects"], svc["projects"], strict=True):
        assert set(sp) == set(vp)
        assert sp["project"] == vp["project"]
        for su in sp["users"]:
            assert set(su) == set(vp["users"][0])
    # the same figures where the two describe the same thing: bob's 90 % busy line
    sb = next(u for p in sim["projects"] for u in p["users"] if u["user"] == "bob")
    vb = next(u for p in svc["projects"] for u in p["users"] if u["user"] == "bob")
    assert sb["idle_share"] == pytest.approx(vb["idle_share"], rel=0.02)


def test_simulated_report_sums_and_busy_from_the_trace(tmp_path: Path) -> None:
    rep = json.loads(handmade(tmp_path, "sim.json").read_text())
    users = {u["user"]: u for p in rep["projects"] for u in p["users"]}
    assert users["bob"]["charged_gpu_h"] == pytest.approx(3.0)
    assert users["bob"]["busy_gpu_h"] == pytest.approx(2.7)
    assert users["carol"]["busy_gpu_h"] == pytest.approx(0.1)
    # dave's row gave no busy share: unknown, never 0
    assert users["dave"]["charged_gpu_h"] == pytest.approx(2.0)
    assert users["dave"]["busy_gpu_h"] is None and users["dave"]["idle_gpu_h"] is None
    # users sum to their project, projects to the total; the total's busy covers the
    # measured part only (measured_gpu_h says how much)
    for p in rep["projects"]:
        for k in ("charged_gpu_h", "measured_gpu_h"):
            assert sum(u[k] for u in p["users"]) == pytest.approx(p[k])
    t = rep["totals"]
    assert sum(p["charged_gpu_h"] for p in rep["projects"]) == pytest.approx(t["charged_gpu_h"])
    assert t["charged_gpu_h"] == pytest.approx(6.0)
    assert t["measured_gpu_h"] == pytest.approx(4.0)
    assert t["busy_gpu_h"] == pytest.approx(2.8)
    assert t["idle_share"] == pytest.approx(1.2 / 4.0)
    # carol's session sat idle 0.9 of its GPU-hour
    assert rep["idle_sessions"][0]["user"] == "carol"
    assert rep["idle_sessions"][0]["idle_gpu_h"] == pytest.approx(0.9)
    # a grant pro rata for the simulated period (3 h of the 7-day window)
    lattice = next(p for p in rep["projects"] if p["project"] == "lattice")
    assert lattice["grant_gpu_h"] == pytest.approx(
        lattice["grant_gpu_h_per_window"] * (rep["to"] - rep["from"]) / (7 * 86400))
    # the CSV's rows sum as the JSON's
    rows = list(csv.DictReader(io.StringIO(handmade(tmp_path, "sim.csv").read_text())))
    total = next(r for r in rows if r["row"] == "total")
    assert sum(float(r["charged_gpu_h"]) for r in rows if r["row"] == "user") == pytest.approx(
        float(total["charged_gpu_h"]))
    assert float(total["busy_gpu_h"]) == pytest.approx(2.8)
    assert next(r for r in rows if r["user"] == "dave")["busy_gpu_h"] == ""


def test_member_share_error_inside_a_project(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    handmade(tmp_path, "sim.json")
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    lattice = m["member_shares"]["lattice"]
    bob, carol = lattice["members"]["bob"], lattice["members"]["carol"]
    # bob got 3 of lattice's 4 GPU-hours, carol 1: an equal share is 50 % each
    assert bob["delivered_share"] == pytest.approx(0.75)
    assert bob["fair_share"] == pytest.approx(0.5) and carol["fair_share"] == pytest.approx(0.5)
    assert bob["share_error_pts"] == pytest.approx(25.0)
    assert carol["share_error_pts"] == pytest.approx(-25.0)
    assert lattice["share_error_pts"] == pytest.approx(25.0)
    # ... but each got all they asked for: no error from the entitled (max-min) share
    assert bob["entitled_share"] == pytest.approx(0.75)
    assert lattice["entitled_share_error_pts"] == pytest.approx(0.0, abs=1e-9)
    # astro has one member: their share is the fair one
    assert m["member_shares"]["astro"]["share_error_pts"] == pytest.approx(0.0)
    assert m["member_share_error_pts"] == pytest.approx(25.0)
    # the simulated report carries the same figures; the table shows them
    rep = json.loads((tmp_path / "sim.json").read_text())
    assert rep["member_shares"]["lattice"]["members"]["bob"]["share_error_pts"] == pytest.approx(25.0)
    (tmp_path / "loud").mkdir()
    assert run(["--trace", str(tmp_path / "trace.csv"), "--budgets",
                str(tmp_path / "budgets.yaml"), "--gpus", "2", "--no-plots",
                "--out", str(tmp_path / "loud")]) == 0
    out = capsys.readouterr().out
    assert "Members' shares inside projects" in out and "+25.0 pt" in out


def test_default_synthetic_run_writes_a_report_with_busy_unknown(tmp_path: Path) -> None:
    rep = json.loads(simulate_report(tmp_path, "r.json", "--workloads", "80", "--days",
                                     "0.5", "--gpus", "8").read_text())
    assert rep["totals"]["charged_gpu_h"] > 0
    # the synthetic workload says nothing of busy time: unknown everywhere, never 0
    assert rep["totals"]["busy_gpu_h"] is None and rep["totals"]["measured_gpu_h"] == 0.0
    assert all(u["busy_gpu_h"] is None for p in rep["projects"] for u in p["users"])
    assert sum(p["charged_gpu_h"] for p in rep["projects"]) == pytest.approx(
        rep["totals"]["charged_gpu_h"])


def test_public_itp_trace_has_no_busy_time(tmp_path: Path, shared_traces: Path) -> None:
    rep = json.loads(simulate_report(
        tmp_path, "r.json", "--trace", str(shared_traces / "itp" / "cluster10.csv"),
        "--horizon", "48").read_text())
    assert rep["totals"]["charged_gpu_h"] > 0 and rep["totals"]["busy_gpu_h"] is None
    assert {k for p in rep["projects"] for k in p} >= {"charged_gpu_h", "users", "grant_gpu_h"}


def test_busy_column_outside_0_to_1_names_line_and_column() -> None:
    with pytest.raises(TraceError) as e:
        parse_native("id,submit,duration,gpus,busy\na,0,1h,1,0.5\nb,0,1h,1,1.5\n", "t.csv")
    assert str(e.value).startswith("t.csv:3: busy:")
    assert parse_native("submit,duration,gpus,busy\n0,1h,1,\n").jobs[0].busy is None


def test_compare_writes_the_report_of_each_run(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text(TRACE)
    (tmp_path / "a.yaml").write_text(BUDGETS)
    (tmp_path / "b.yaml").write_text(BUDGETS.replace("grant: 60", "grant: 80"))
    simulate_report(tmp_path, "r.json", "--trace", str(tmp_path / "trace.csv"), "--budgets",
                    str(tmp_path / "a.yaml"), "--compare", str(tmp_path / "b.yaml"), "--gpus",
                    "2")
    a = json.loads((tmp_path / "r.json").read_text())
    b = json.loads((tmp_path / "r-b.json").read_text())
    grant = {r: next(p for p in x["projects"] if p["project"] == "lattice")
             ["grant_gpu_h_per_window"] for r, x in (("a", a), ("b", b))}
    assert grant == {"a": 60, "b": 80}
    assert a["totals"]["charged_gpu_h"] == pytest.approx(b["totals"]["charged_gpu_h"])
