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
])
def test_bad_comparison_arguments_are_refused_before_anything_runs(
        argv: list[str], says: str, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "argv", ["policy_seeds.py", *argv])
    with pytest.raises(SystemExit) as e:
        policy_seeds.main()
    assert e.value.code == 2
    assert says in capsys.readouterr().err
