"""Off-peak prices in the simulator (sim/offpeak.py, ``gpubudget simulate --off-peak``): a
tiny trace computed by hand, the CLI's figures, and the incremental usage meter's figures with
off-peak prices equal to the exact meter's."""

from __future__ import annotations

import json
import random

import pytest

from jupyter_gpubudget.cli import main
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import DAY, Policy
from jupyter_gpubudget.core.pricing import make_off_peak
from jupyter_gpubudget.core.usage import UsageMeter
from jupyter_gpubudget.sim.engine import SimConfig
from jupyter_gpubudget.sim.fastmeter import IncrementalUsageMeter
from jupyter_gpubudget.sim.offpeak import can_wait, move_to_windows, replay
from jupyter_gpubudget.sim.traces import parse_native

BUDGETS = load_budgets("accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n", "b.yaml")
ONE_NODE = Inventory((make_node("n0", "H100-80GB", 2),))
# trace time is UNIX time: 0 is Thursday 1 January 1970, 00:00 UTC. The default windows
# (weekday nights from 20:00, weekends) start at 72000 on that day
TRACE = ("id,submit,duration,gpus,project,user,kind\n"
         "train,36000,7200,1,a,ann,batch\n"        # 10:00, 2 h: waits for 20:00
         "late,75600,3600,1,a,ann,batch\n"         # 21:00: inside a window, runs at once
         "lab,36000,3600,1,b,bob,interactive\n")   # a session never waits


def test_a_tiny_trace_by_hand() -> None:
    trace = parse_native(TRACE, "t.csv")
    out = replay(trace, BUDGETS, ONE_NODE, SimConfig(cycle_interval=60), factor=0.5)
    assert out["jobs_moved"] == 1 and out["jobs_moved_wait_h_median"] == 10.0
    # batch GPU-hours: 2 (train) + 1 (late); before only late's hour was in a window, after
    # all three hours are
    assert out["before"]["batch_gpu_hours"] == out["after"]["batch_gpu_hours"] == 3.0
    assert out["before"]["batch_in_window_share"] == pytest.approx(1 / 3, abs=1e-4)
    assert out["after"]["batch_in_window_share"] == 1.0
    assert out["moved_share"] == pytest.approx(2 / 3, abs=1e-4)
    # the span: 10:00 (the first submission) to 22:00 (train's end after); the window in it
    # is 20:00-22:00 on 2 GPUs: 4 GPU-hours, of which late used 1 before, train and late 3
    assert out["span_h"] == 12.0
    assert out["before"]["window_utilisation"] == 0.25
    assert out["after"]["window_utilisation"] == 0.75
    # outside: 10 h × 2 GPUs; before train (2) and lab (1), after only lab
    assert out["before"]["outside_utilisation"] == 0.15
    assert out["after"]["outside_utilisation"] == 0.05


def test_which_jobs_wait() -> None:
    trace = parse_native(TRACE, "t.csv")
    nights = make_off_peak("UTC", 0.5, ["Mon-Fri 20:00-07:00"])
    moved_trace, moved = move_to_windows(trace, nights)
    assert moved == {"train": 36000.0}
    assert {j.id: j.submit for j in moved_trace.jobs} == {"train": 72000.0, "late": 75600.0,
                                                          "lab": 36000.0}
    assert not can_wait("x", "interactive", 1.0) and not can_wait("x", "debug", 1.0)
    picked = sum(can_wait(f"j{i}", "batch", 0.3) for i in range(2000))
    assert 500 < picked < 700  # a deterministic 30 % of the batch jobs


def test_the_cli_prints_and_writes_the_figures(tmp_path, capsys) -> None:  # noqa: ANN001
    (tmp_path / "t.csv").write_text(TRACE)
    (tmp_path / "inv.yaml").write_text("nodes:\n  - {name: n0, model: H100-80GB, gpus: 2}\n")
    (tmp_path / "b.yaml").write_text("accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n")
    rc = main(["simulate", "--trace", str(tmp_path / "t.csv"), "--inventory",
               str(tmp_path / "inv.yaml"), "--budgets", str(tmp_path / "b.yaml"),
               "--cycle-interval", "60", "--off-peak", "0.5", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "share of batch GPU-hours that moved into the windows: +66.7%" in out
    figures = json.loads((tmp_path / "o" / "off-peak.json").read_text())
    assert figures["after"]["window_utilisation"] == 0.75
    rc = main(["simulate", "--trace", str(tmp_path / "t.csv"), "--inventory",
               str(tmp_path / "inv.yaml"), "--budgets", str(tmp_path / "b.yaml"),
               "--off-peak", "policy", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "the budgets file sets no off_peak policy" in capsys.readouterr().err
    assert main(["simulate", "--off-peak", "2", "--out", str(tmp_path / "o")]) == 2
    # the budgets file's own windows (here: from 21:00 only), its factor or another
    (tmp_path / "b.yaml").write_text(
        "policy:\n  off_peak: {timezone: UTC, factor: 0.25, windows: ['Thu 21:00-23:00']}\n"
        "accounts:\n  a: {grant: 100}\n  b: {grant: 100}\n")
    for how, factor in (("policy", 0.25), ("0.5", 0.5)):
        rc = main(["simulate", "--trace", str(tmp_path / "t.csv"), "--inventory",
                   str(tmp_path / "inv.yaml"), "--budgets", str(tmp_path / "b.yaml"),
                   "--cycle-interval", "60", "--off-peak", how, "--quiet",
                   "--json", str(tmp_path / "p.json")])
        assert rc == 0
        figures = json.loads((tmp_path / "p.json").read_text())
        assert figures["off_peak"] == {"timezone": "UTC", "factor": factor,
                                       "windows": ["Thu 21:00-23:00"]}
        assert figures["jobs_moved"] == 1  # train waits for 21:00; late came at 21:00


@pytest.mark.parametrize("seed", [0, 1])
def test_the_incremental_meter_prices_like_the_exact_one(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy(window=2 * DAY, off_peak=make_off_peak(
        "Europe/Berlin", 0.4, ["Mon-Fri 19:00-07:30", "Sat-Sun 00:00-24:00"]))
    exact, fast = UsageMeter(policy), IncrementalUsageMeter(policy)
    now = 1_774_000_000.0 + rng.random() * DAY  # across the spring change (29 March 2026)
    running: dict[str, str] = {}
    for k in range(300):
        now += rng.expovariate(1 / 1800)
        if running and rng.random() < 0.5:
            wid = rng.choice(sorted(running))
            del running[wid]
            for m in (exact, fast):
                m.close(wid, now)
        else:
            wid = f"w{k}"
            running[wid] = rng.choice("abc")
            milli = rng.choice([125, 500, 1000, 8000])
            for m in (exact, fast):
                m.open_interval(wid, running[wid], "u", milli, now)
        if k % 7 == 0:
            e, f = exact.usage(now), fast.usage(now)
            assert set(e) == set(f)
            for p in e:
                assert f[p] == pytest.approx(e[p], rel=1e-9, abs=1e-6)
    assert not fast._exact  # the incremental path, not its fallback
