"""`gpubudget simulate` over two named clusters with one budget tree: the
report gives each cluster's utilisation and the programs' shares of what it delivered, and
the global figures, which add up over the clusters."""

from __future__ import annotations

import json
from pathlib import Path

from tests.sim.test_cli import EXAMPLES, run

A = "nodes:\n  - {name: a, replicas: 2, model: H100-80GB, gpus: 4}\n"
B = "nodes:\n  - {name: b, replicas: 2, model: H100-80GB, gpus: 4}\n"


def test_two_clusters_report_per_cluster_and_global_shares(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.yaml").write_text(A)
    (tmp_path / "b.yaml").write_text(B)
    rc = run(["--trace", str(EXAMPLES / "trace-native.csv"),
              "--budgets", str(EXAMPLES / "budgets-sim.yaml"),
              "--inventory", f"slurm={tmp_path / 'a.yaml'}",
              "--inventory", f"k8s={tmp_path / 'b.yaml'}",
              "--out", str(tmp_path), "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "Per cluster (one budget tree)" in out
    m = json.loads((tmp_path / "metrics.json").read_text())
    cl = m["clusters"]
    assert set(cl) == {"slurm", "k8s"} and m["gpus"] == 16
    assert all(c["gpus"] == 8 and c["delivered_gpu_hours"] > 0 for c in cl.values())
    # one budget tree: what every cluster delivered is the global figure
    total = sum(c["delivered_gpu_hours"] for c in cl.values())
    assert abs(total - m["delivered_gpu_hours"]) < 1e-6 * max(1.0, total)
    for c in cl.values():
        assert abs(sum(c["program_shares"].values()) - 1.0) < 1e-9
    # a program's global share is its GPU-hours on both clusters over all of them
    for prog, acc in m["accounts"].items():
        if acc["parent"] is None:
            hours = sum(c["program_shares"].get(prog, 0.0) * c["delivered_gpu_hours"]
                        for c in cl.values())
            assert abs(hours / total - acc["delivered_share"]) < 1e-6


def test_several_inventories_need_names(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a.yaml").write_text(A)
    rc = run(["--trace", str(EXAMPLES / "trace-native.csv"),
              "--inventory", str(tmp_path / "a.yaml"), "--inventory", str(tmp_path / "a.yaml"),
              "--no-plots", "--out", str(tmp_path)])
    assert rc == 2
    assert "NAME=FILE" in capsys.readouterr().err
