"""bench/policy_frontier.py: policies over seeds side by side — its variants read as the
budgets YAML reads them, bad arguments refused before anything runs, each policy summed
over the seeds as bench/policy_seeds.py judges one, and the chart drawn."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import policy_frontier  # noqa: E402
import policy_seeds  # noqa: E402


def test_a_variant_is_read_as_the_budgets_yaml_reads_it() -> None:
    name, sets = policy_frontier.parse_variant(
        " late gangs : gang_overdue_after=1h, finish_drain_budget=0.005 ")
    assert name == "late gangs"
    assert sets == {"gang_overdue_after": 3600.0, "finish_drain_budget": 0.005}


@pytest.mark.parametrize("text, says", [
    ("finish_drain_budget=0.005", "expected 'NAME: KEY=VALUE"),
    (": finish_drain_budget=0.005", "expected 'NAME: KEY=VALUE"),
    ("b:", "no policy key given"),
    ("b: no_such_key=1", "unknown policy key 'no_such_key'"),
    ("b: finish_drain_budget=lots", "'b'"),
])
def test_a_bad_variant_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError) as e:
        policy_frontier.parse_variant(text)
    assert says in str(e.value)


@pytest.mark.parametrize("argv, says", [
    (["--runs", "week"], "--runs: expected 3day and/or month"),
    (["--variant", "defaults: finish_drain_budget=0.005"], "a name of its own"),
    (["--variant", "a: finish_drain_budget=0.005", "--variant", "a: short_lane_hold=2"],
     "a name of its own"),
    (["--variant", "a: finish_drain_budget"], "expected KEY=VALUE"),
    (["--plot", "chart.svg"], "expected a .png"),
    (["--plot", "/no/such/dir/chart.png"], "cannot write a file in"),
    (["--seeds", "x"], "seeds: expected numbers"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv: list[str], says: str,
                                                         capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        policy_frontier.main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert says in captured.err
    assert "simulations" not in captured.out


def row(share: float, preempt: float, floor: float) -> dict[str, float | None]:
    return {"share_error_pts": share, "preemptions_per_workload": preempt,
            "lost_pct_of_delivered": 0.5, "debug_p90_s": None, "utilisation": 0.9,
            "entitled_share_error_pts": share, "share_error_floor_pts": floor}


def test_summarise_takes_means_worsts_and_the_pairs_missed() -> None:
    s = policy_frontier.summarise("3day", [row(1.0, 0.05, 0.0), row(5.0, 0.12, 4.5),
                                           row(3.0, 0.10, 1.0)])
    assert s["share_error_pts"] == {"mean": pytest.approx(3.0), "worst": 5.0, "seeds_met": 2}
    assert s["preemptions_per_workload"]["worst"] == 0.12
    assert s["preemptions_per_workload"]["seeds_met"] == 2
    assert s["share_error_floor_pts"]["worst"] == 4.5
    assert "debug_p90_s" not in s  # no figure on any seed: nothing to judge
    assert s["goals_missed"] == 2  # seed 1's share error and its preemptions


def test_a_small_run_sums_each_policy_as_policy_seeds_judges_it(tmp_path: Path,
                                                                capsys) -> None:  # type: ignore[no-untyped-def]
    chart = tmp_path / "frontier.png"
    out = policy_frontier.main(["--seeds", "0", "--jobs", "2", "--plot", str(chart),
                                "--variant", "no drains: finish_drain_ratio=0"])
    assert list(out["policies"]) == ["defaults", "no drains"]
    assert out["policies"]["no drains"]["set"] == {"finish_drain_ratio": 0.0}
    # the same simulation as policy_seeds' for the same seed and keys
    alone = policy_seeds.one("3day", 0, {})
    d = out["policies"]["defaults"]["3day"]
    assert d["share_error_pts"]["mean"] == pytest.approx(alone["share_error_pts"])
    assert d["lost_pct_of_delivered"]["worst"] == pytest.approx(alone["lost_pct_of_delivered"])
    missed = sum(policy_seeds.meets(alone[key], op, goal) is False
                 for _, key, op, goal in policy_seeds.FIGURES["3day"] if op)
    assert d["goals_missed"] == missed
    printed = capsys.readouterr().out
    assert json.loads(printed.strip().splitlines()[-1]) == json.loads(json.dumps(out))
    assert "no drains" in printed and "goals missed" in printed
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert chart.stat().st_size > 20_000
