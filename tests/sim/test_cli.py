"""`gpubudget simulate` end to end on small inputs (no shared data needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from jupyter_gpubudget.cli.simulate import add_simulate_parser

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpubudget")
    sub = p.add_subparsers(dest="command", required=True)
    add_simulate_parser(sub)
    args = p.parse_args(["simulate", *argv])
    return int(args.func(args))


def test_builtin_synthetic_writes_table_json_and_plots(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = run(["--workloads", "150", "--days", "1", "--gpus", "16", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Waits and completion by kind" in out and "Share of grant delivered" in out
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["workloads"] == 150 and set(m["kinds"]) == {"interactive", "batch", "debug"}
    for name in ("wait_cdf.png", "delivered_vs_grant.png", "utilisation.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_native_example_with_compare(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = run(["--trace", str(EXAMPLES / "trace-native.csv"),
              "--budgets", str(EXAMPLES / "budgets-sim.yaml"),
              "--compare", str(EXAMPLES / "budgets-sim-more-ml.yaml"),
              "--out", str(tmp_path), "--no-plots"])
    assert rc == 0
    assert "What-if" in capsys.readouterr().out
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert set(m) == {"a", "b", "diff"}
    d = m["diff"]["ml.grant_share"]
    assert d["b"] > d["a"]
    # the example is contended: a larger grant gets ml a larger share of what ran while
    # work waited (everything completes in the end, so the whole run's share cannot move)
    c = m["diff"]["ml.contended_share"]
    assert c["b"] > c["a"] + 0.03, c
    assert m["a"]["unused"]["empty_queue"] < 0.5


def test_malformed_trace_is_refused_with_line_and_column(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.csv"
    bad.write_text("submit,duration,gpus,project\n0,60,1,lattice\n30,soon,1,lattice\n")
    rc = run(["--trace", str(bad), "--out", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: duration:" in err
    assert not (tmp_path / "metrics.json").exists()


def test_bad_budgets_are_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    b = tmp_path / "b.yaml"
    b.write_text("accounts:\n  a: {grant: -1}\n")
    assert run(["--budgets", str(b), "--out", str(tmp_path)]) == 2
    assert "b.yaml:2" in capsys.readouterr().err


def test_shared_itp_cluster10(shared_traces, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rc = run(["--trace", str(shared_traces / "itp" / "cluster10.csv"),
              "--budgets", str(EXAMPLES / "budgets-itp.yaml"), "--out", str(tmp_path),
              "--quiet"])
    assert rc == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["workloads"] >= 259 and m["kinds"]["batch"]["completed"] == m["workloads"]


@pytest.mark.parametrize("missing", [["--trace", "x.csv"], []])
def test_placement_repro_needs_both_lists(missing: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    assert run(["--placement-repro", *missing]) == 2


def test_placement_repro_on_small_lists(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{i},32000,131072,{2 + 2 * (i % 2)},T4\n" for i in range(10)))
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "".join(
        f"p{i},{2000 + 1000 * (i % 5)},4096,{1 if i % 7 else 2},{[250, 500, 1000, 700][i % 4] if i % 7 else 1000},\n"
        for i in range(40)))
    rc = run(["--placement-repro", "--trace", str(pods), "--nodes", str(nodes), "--seeds", "2",
              "--out", str(tmp_path)])
    assert rc == 0
    assert "openb placement at 130% arrived" in capsys.readouterr().out
    out = json.loads((tmp_path / "openb_placement.json").read_text())
    assert set(out["summary"]) == {"bestfit", "default"}
    assert all(0 < r["alloc_pct"] <= 100 for rs in out["runs"].values() for r in rs)


def test_budget_change_option(tmp_path: Path) -> None:
    rc = run(["--workloads", "120", "--days", "1", "--gpus", "16", "--out", str(tmp_path),
              "--no-plots", "--quiet",
              "--budget-change", f"12:{EXAMPLES / 'budgets-sim-more-ml.yaml'}"])
    assert rc == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["accounts"]["ml"]["grant_hours_per_window"] == 5000  # the tree in force at the end
    assert run(["--budget-change", "soon", "--out", str(tmp_path)]) == 2


def test_piped_tables_keep_names_whole(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = run(["--workloads", "120", "--days", "1", "--gpus", "16", "--out", str(tmp_path),
              "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out  # captured: not a terminal, as when piped
    assert "…" not in out
    for text in ("foundation", "share while contended", "held for a gang's reservation",
                 "never started", "preemptions"):
        assert text in out


def test_delivered_vs_grant_chart_shows_demand(tmp_path: Path) -> None:
    """The bar chart carries four bars per account: grant, demand, delivered, delivered
    while work waited (read from the legend of the figure the report saves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jupyter_gpubudget.sim import report
    from jupyter_gpubudget.sim.engine import SimConfig
    from jupyter_gpubudget.sim.run import prepare, run_one

    setup = prepare(str(EXAMPLES / "trace-native.csv"), str(EXAMPLES / "budgets-sim.yaml"))
    res, m = run_one(setup, setup.budgets, SimConfig())
    captured = {}
    real = plt.Figure.savefig

    def keep(fig, path, *a, **k):  # type: ignore[no-untyped-def]
        captured[Path(path).name] = [t.get_text() for ax in fig.axes
                                     for t in ax.get_legend().get_texts()]
        return real(fig, path, *a, **k)

    plt.Figure.savefig = keep  # type: ignore[method-assign]
    try:
        report.write_plots(res, m, tmp_path)
    finally:
        plt.Figure.savefig = real  # type: ignore[method-assign]
    assert captured["delivered_vs_grant.png"] == [
        "grant share (among siblings)", "demand share", "delivered share",
        "delivered share while work waited"]
