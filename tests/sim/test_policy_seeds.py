"""bench/policy_seeds.py's paired comparison (``--compare``): which way is better for each
goal, the sign test, and the seed x goal pairs that change side."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import policy_seeds  # noqa: E402


def test_sign_test_two_sided() -> None:
    assert policy_seeds.sign_test(10, 0) == pytest.approx(2 / 1024)
    assert policy_seeds.sign_test(0, 10) == pytest.approx(2 / 1024)
    assert policy_seeds.sign_test(5, 5) == 1.0
    assert policy_seeds.sign_test(0, 0) == 1.0
    # 8 of 10 one way: 2 * (1 + 10 + 45) / 1024
    assert policy_seeds.sign_test(8, 2) == pytest.approx(112 / 1024)


def row(util: float, share: float) -> dict[str, float]:
    return {"utilisation": util, "share_error_pts": share, "debug_p90_s": 100.0,
            "preemptions_per_workload": 0.05, "lost_pct_of_delivered": 0.5,
            "entitled_share_error_pts": share, "share_error_floor_pts": 0.0}


def test_compare_knows_which_way_is_better_and_counts_pairs(capsys) -> None:  # type: ignore[no-untyped-def]
    # seed 0: utilisation up across the goal (0.94 -> 0.96), share error up across it
    # (1.5 -> 2.5); seed 1: utilisation down (0.97 -> 0.96), share error down (1.0 -> 0.5)
    base = {("month", 0): row(0.94, 1.5), ("month", 1): row(0.97, 1.0)}
    new = {("month", 0): row(0.96, 2.5), ("month", 1): row(0.96, 0.5)}
    out = policy_seeds.compare(base, new, ["month"], [0, 1])
    util, share = out["month.utilisation"], out["month.share_error_pts"]
    assert (util["better"], util["worse"]) == (1, 1)
    assert util["mean_change"] == pytest.approx(0.005)
    assert (share["better"], share["worse"]) == (1, 1)  # lower is better for an error
    assert share["mean_change"] == pytest.approx(0.25)
    assert out["goals_missed"] == {"defaults": 1, "policy": 1}
    assert out["pairs"] == {"newly_met": 1, "newly_missed": 1}
    assert "month utilisation: +0.005 on average" in capsys.readouterr().out


def test_plot_draws_a_panel_per_goal(tmp_path: Path) -> None:
    base = {("month", 0): row(0.94, 1.5), ("month", 1): row(0.97, 1.0)}
    new = {("month", 0): row(0.96, 2.5), ("month", 1): row(0.96, 0.5)}
    path = tmp_path / "compare.png"
    policy_seeds.plot(base, new, ["month"], [0, 1], {"finish_drain_budget": 0.012}, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


@pytest.mark.parametrize("argv, says", [
    (["--plot", "c.png"], "--plot: draws the comparison"),
    (["--compare", "--set", "finish_drain_budget=0.01", "--plot", "c.svg"], "expected a .png"),
    (["--compare"], "--compare: give the policy"),
    (["--compare", "--set", "finish_drain_budget=0.01", "--baseline", "x.json"],
     "leave out --compare"),
    (["--baseline", "/nonexistent/x.json"], "cannot read"),
    (["--save", "/nonexistent/dir/x.json"], "--save: cannot write a file in"),
])
def test_bad_comparison_arguments_are_refused_before_anything_runs(
        argv: list[str], says: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "argv", ["policy_seeds.py", *argv])
    with pytest.raises(SystemExit) as e:
        policy_seeds.main()
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def saved_output(seeds: list[int], runs: tuple[str, ...] = ("month",)) -> str:
    """What policy_seeds.py prints: a table, then the JSON line."""
    import json
    data: dict = {"seeds": seeds, "set": {}}
    for which in runs:
        data[which] = {"per_seed": [{"run": which, "seed": s, **row(0.95, 1.0)}
                                    for s in seeds]}
    return "seeds ...\n\nmonth: the seed's month\n  seed  utilisation\n" + json.dumps(data) + "\n"


def test_a_baseline_is_read_from_the_printed_output_or_the_json(tmp_path: Path) -> None:
    printed = tmp_path / "out.txt"
    printed.write_text(saved_output([0, 1, 2]))
    got = policy_seeds.load_baseline(str(printed), ["month"], [0, 2])
    assert set(got) == {("month", 0), ("month", 1), ("month", 2)}
    assert got[("month", 2)]["utilisation"] == 0.95
    bare = tmp_path / "out.json"
    bare.write_text(saved_output([0])[saved_output([0]).index("{"):])
    assert set(policy_seeds.load_baseline(str(bare), ["month"], [0])) == {("month", 0)}


@pytest.mark.parametrize("content, runs, seeds, says", [
    (None, ["month"], [0], "cannot read"),
    ("not json\n", ["month"], [0], "is not the output of policy_seeds.py"),
    (saved_output([0, 1]), ["month"], [0, 5], "lacks seeds [5] of the month run"),
    (saved_output([0]), ["3day"], [0], "has no 3day run (it has month)"),
    (saved_output([0]).replace('"utilisation": 0.95, ', ""), ["month"], [0],
     "lacks utilisation for seed 0"),
])
def test_a_baseline_that_does_not_match_is_refused_saying_why(
        tmp_path: Path, content: str | None, runs: list[str], seeds: list[int],
        says: str) -> None:
    path = tmp_path / "saved.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=r"--baseline: .*" + __import__("re").escape(says)):
        policy_seeds.load_baseline(str(path), runs, seeds)


def test_a_saved_run_is_the_baseline_of_the_next(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The 3-day run of seed 0, saved, then run again against it with a policy key changed:
    the comparison is made with the saved figures (no defaults run: a figure altered in the
    file is what the change is measured from), and drawn."""
    import json
    saved, chart = tmp_path / "base.json", tmp_path / "c.png"
    common = ["policy_seeds.py", "--seeds", "0", "--runs", "3day", "--jobs", "1"]
    monkeypatch.setattr(sys, "argv", [*common, "--save", str(saved)])
    policy_seeds.main()
    base = json.loads(saved.read_text())
    assert [r["seed"] for r in base["3day"]["per_seed"]] == [0]
    assert base["3day"]["per_seed"][0]["preemptions_per_workload"] > 0
    base["3day"]["per_seed"][0]["preemptions_per_workload"] = 0.5  # a baseline of its own
    saved.write_text(json.dumps(base))
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", [*common, "--set", "preemption=false",
                                      "--baseline", str(saved), "--plot", str(chart)])
    policy_seeds.main()
    out = capsys.readouterr().out
    assert f"the baseline: {saved}" in out
    assert "compared with the baseline, seed by seed" in out
    result = json.loads(out.strip().splitlines()[-1])
    now = result["3day"]["per_seed"][0]["preemptions_per_workload"]
    assert now < 0.5
    assert result["compare"]["3day.preemptions_per_workload"]["mean_change"] == (
        pytest.approx(now - 0.5))
    assert set(result["compare"]["goals_missed"]) == {"baseline", "policy"}
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
