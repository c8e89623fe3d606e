"""Bookings carried by the trace itself: a native CSV row of kind ``reservation`` is a
booking (whole GPUs for a project over ``[submit, submit + duration)``), replayed as a
booking of the ``--reservations`` file is; hostile rows are refused with their line. The
hand-worked outcome is tests/sim/test_sim_bookings.py's (the same booking, given in the
trace instead of a side file)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jupyter_gpubudget.sim.bookings import cost_to_others
from jupyter_gpubudget.sim.engine import SimConfig, simulate
from jupyter_gpubudget.sim.traces import TraceError, assign_projects, parse_native

from .test_sim_bookings import BUDGETS, BUDGETS_YAML, NODE, TRACE

#: the side file's booking (lab, 1 GPU, [2 h, 4 h)) as a row of the trace
BOOKED = TRACE + "course,2h,2h,1,lab,,reservation,\n"


def test_a_trace_row_books_as_the_side_file_does():
    trace = assign_projects(parse_native(BOOKED, "t.csv"), BUDGETS.accounts)
    assert [j.id for j in trace.jobs] == ["a", "b", "l"]  # the booking is not a workload
    (bk,) = trace.bookings
    assert (bk.id, bk.project, bk.start, bk.end, bk.gpus, bk.line) == \
        ("course", "lab", 7200.0, 14400.0, 1, 5)
    cfg = SimConfig(cycle_interval=60)
    with_b = simulate(trace, BUDGETS.accounts, NODE, BUDGETS.policy,
                      SimConfig(cycle_interval=60, bookings=trace.bookings_from_start()))
    without = simulate(trace, BUDGETS.accounts, NODE, BUDGETS.policy, cfg)
    # the outcome worked out in test_sim_bookings: b waits for a; l starts in its booking
    assert (with_b.records["a"].wait, with_b.records["b"].wait) == (0, 3 * 3600 - 60)
    assert with_b.records["l"].wait == 60
    rep = cost_to_others(with_b, without, with_b.booked.bookings, with_b.booked)
    assert rep["bookings"] == [{"id": "course", "project": "lab", "gpus": 1,
                                "booked_gpu_hours": 2.0, "used_gpu_hours": 1.0,
                                "unused_gpu_hours": 1.0}]


def test_windows_count_from_the_traces_first_submission():
    """A trace whose first workload comes at 1 h: a booking row at 3 h is 2 h from the
    trace's start, as ``start: 2h`` in a reservations file."""
    text = ("id,submit,duration,gpus,project,user,kind\n"
            "a,1h,1h,1,other,olga,batch\nr,3h,1h,2,lab,,reservation\n")
    (bk,) = parse_native(text, "t.csv").bookings_from_start()
    assert (bk.start, bk.end) == (7200.0, 10800.0)


HEAD = "id,submit,duration,gpus,project,user,kind,nodes\na,0,1h,1,other,olga,batch,\n"


@pytest.mark.parametrize(("row", "match"), [
    ("r,2h,0,1,lab,,reservation,", r"t\.csv:3.*duration.*longer than zero"),
    ("r,2h,-1h,1,lab,,reservation,", r"t\.csv:3.*duration"),
    ("r,later,1h,1,lab,,reservation,", r"t\.csv:3.*submit"),
    ("r,2h,1h,0,lab,,reservation,", r"t\.csv:3.*gpus.*at least one GPU"),
    ("r,2h,1h,1,,,reservation,", r"t\.csv:3.*project.*names its project"),
    ("r,2h,1h,1,lab,lee,reservation,", r"t\.csv:3.*user.*not a column of a reservation"),
    ("a,2h,1h,1,lab,,reservation,", r"t\.csv:3.*duplicate id 'a'"),
    ("j,2h,1h,1,lab,lee,batch,n0", r"t\.csv:3.*nodes.*reservation rows only"),
])
def test_a_hostile_reservation_row_is_refused_with_its_line(row, match):
    with pytest.raises(TraceError, match=match):
        parse_native(HEAD + row + "\n", "t.csv")


def test_a_booking_for_an_unknown_project_is_refused_with_its_line():
    trace = parse_native(HEAD + "r,2h,1h,1,nolab,,reservation,\n", "t.csv")
    with pytest.raises(TraceError, match=r"t\.csv:3.*reservation r books for 'nolab'"):
        assign_projects(trace, BUDGETS.accounts)


def test_the_cli_replays_the_traces_bookings_and_refuses_what_does_not_fit(tmp_path):
    (tmp_path / "b.yaml").write_text(BUDGETS_YAML)
    (tmp_path / "inv.yaml").write_text("nodes:\n  - {name: n0, gpus: 2, model: H100-80GB}\n")
    base = [sys.executable, "-m", "jupyter_gpubudget.cli", "simulate", "--trace",
            str(tmp_path / "t.csv"), "--budgets", str(tmp_path / "b.yaml"), "--inventory",
            str(tmp_path / "inv.yaml"), "--cycle-interval", "60", "--no-plots",
            "--out", str(tmp_path / "out")]
    (tmp_path / "t.csv").write_text(BOOKED)
    p = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads((tmp_path / "out" / "metrics.json").read_text())["reservations"]
    assert got["others_wait_p50_s"] == {"with": (3 * 3600 - 60) / 2, "without": 0}
    assert got["booked_unused_gpu_hours"] == 1.0
    (tmp_path / "out" / "metrics.json").unlink()
    # three GPUs booked on a two-GPU node: refused naming the trace's line, nothing written
    (tmp_path / "t.csv").write_text(TRACE + "course,2h,2h,3,lab,,reservation,\n")
    p = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "t.csv:5: reservations[course].gpus" in p.stderr, p.stderr
    assert not (tmp_path / "out" / "metrics.json").exists()
    # the trace's booking and a side file's of the same id: one booking per id
    (tmp_path / "t.csv").write_text(BOOKED)
    (tmp_path / "r.yaml").write_text("reservations:\n  - {id: course, project: lab, "
                                     "start: 0, end: 1h, gpus: 1}\n")
    p = subprocess.run([*base, "--reservations", str(tmp_path / "r.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "r.yaml:2: reservations[course].id: a second reservation" in p.stderr, p.stderr

