"""Advance reservations in the simulator (``--reservations FILE.yaml``): replayed through
the same core, with what they cost the others, on a hand-made trace whose outcome is worked
out below."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.yamlnodes import ConfigError
from jupyter_gpubudget.sim.bookings import cost_to_others, load_bookings
from jupyter_gpubudget.sim.engine import SimConfig, simulate
from jupyter_gpubudget.sim.traces import parse_native

BUDGETS_YAML = "accounts:\n  lab: {grant: 100}\n  other: {grant: 100}\n"
BUDGETS = load_budgets(BUDGETS_YAML, "b.yaml")
NODE = Inventory((make_node("n0", "H100-80GB", 2),))
TRACE = ("id,submit,duration,gpus,project,user,kind,time_limit\n"
         "a,0,3h,1,other,olga,batch,3h\n"
         "b,60,3h,1,other,olga,batch,3h\n"
         "l,2h,1h,1,lab,lee,batch,1h\n")
BOOKING = """\
reservations:
  - id: course
    project: lab
    start: 2h
    end: 4h
    gpus: 1
"""


def run(bookings: str | None):  # noqa: ANN201
    trace = parse_native(TRACE, "t.csv")
    cfg = SimConfig(cycle_interval=60, bookings=load_bookings(bookings) if bookings else ())
    return simulate(trace, BUDGETS.accounts, NODE, BUDGETS.policy, cfg)


def test_a_booking_costs_the_others_their_wait_and_is_half_used():
    """Two GPUs; one booked for lab over [2 h, 4 h). other's a (t=0) and b (t=60 s) each run
    3 h. Without the booking both start at once (waits 0, 0). With it, the booked GPU is held
    back from 2 h: a takes the free GPU at 0; b would run past 2 h, so it may not use the
    booked GPU; it waits for a to end at 3 h (wait 3 h − 60 s). lab's l (1 h, at 2 h) starts
    in its booking within one cycle (60 s): 1 of the 2 booked GPU-hours used, 1 unused."""
    with_b, without = run(BOOKING), run(None)
    assert (without.records["a"].wait, without.records["b"].wait) == (0, 0)
    assert (with_b.records["a"].wait, with_b.records["b"].wait) == (0, 3 * 3600 - 60)
    # l starts in its booking at the next cycle (60 s), runs its hour inside the window
    assert with_b.records["l"].wait == 60 and with_b.records["l"].end == 3 * 3600 + 60
    rep = cost_to_others(with_b, without, with_b.booked.bookings, with_b.booked)
    assert rep["others_jobs"] == 2
    assert rep["others_wait_p50_s"] == {"with": pytest.approx((3 * 3600 - 60) / 2),
                                        "without": 0}
    assert rep["others_wait_p90_s"]["with"] == pytest.approx(0.9 * (3 * 3600 - 60))
    assert rep["bookings"] == [{"id": "course", "project": "lab", "gpus": 1,
                                "booked_gpu_hours": 2.0, "used_gpu_hours": 1.0,
                                "unused_gpu_hours": 1.0}]


@pytest.mark.parametrize(("text", "where"), [
    ("reservations:\n  - {project: lab, start: 2h, end: 1h, gpus: 1}\n", "r.yaml:2"),
    ("reservations:\n  - {project: lab, start: 2h, end: 3h}\n", "missing required key 'gpus'"),
    ("reservations:\n  - {project: lab, start: 2h, end: 3h, gpus: 0}\n", "gpus"),
    ("reservations:\n  - {project: lab, start: soon, end: 3h, gpus: 1}\n", "start"),
])
def test_a_bad_reservations_file_names_the_field_and_line(text, where):
    with pytest.raises(ConfigError, match=where):
        load_bookings(text, "r.yaml")


def test_the_cli_reports_the_cost_and_refuses_what_does_not_fit(tmp_path):
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "b.yaml").write_text(BUDGETS_YAML)
    (tmp_path / "inv.yaml").write_text(
        "nodes:\n  - {name: n0, gpus: 2, model: H100-80GB}\n")
    (tmp_path / "r.yaml").write_text(BOOKING)
    base = [sys.executable, "-m", "jupyter_gpubudget.cli", "simulate", "--trace",
            str(tmp_path / "t.csv"), "--budgets", str(tmp_path / "b.yaml"), "--inventory",
            str(tmp_path / "inv.yaml"), "--cycle-interval", "60", "--no-plots",
            "--out", str(tmp_path / "out")]
    p = subprocess.run([*base, "--reservations", str(tmp_path / "r.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "reservations" in p.stdout and "course" in p.stdout
    got = json.loads((tmp_path / "out" / "metrics.json").read_text())["reservations"]
    assert got["others_wait_p50_s"] == {"with": (3 * 3600 - 60) / 2, "without": 0}
    assert got["booked_unused_gpu_hours"] == 1.0
    (tmp_path / "out" / "metrics.json").unlink()
    (tmp_path / "r.yaml").write_text(BOOKING.replace("gpus: 1", "gpus: 3"))
    p = subprocess.run([*base, "--reservations", str(tmp_path / "r.yaml")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "r.yaml:2: reservations[course].gpus" in p.stderr, p.stderr
    assert not (tmp_path / "out" / "metrics.json").exists()  # nothing ran, nothing written
