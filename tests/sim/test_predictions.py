"""The prediction benchmark's replay, on traces small enough to follow by hand."""

from __future__ import annotations

import numpy as np
import pytest

from jupyter_gpubudget.sim import predictions
from jupyter_gpubudget.sim.traces import parse_native


def test_mdape_and_under_by_hand() -> None:
    p, a = np.array([100.0, 300.0, 50.0, 200.0]), np.array([100.0, 200.0, 100.0, 400.0])
    # errors: 0, 50 %, 50 %, 50 % -> median 50; ran past the prediction: 2 of 4
    assert predictions.mdape(p, a) == 50.0
    assert predictions.under_pct(p, a) == 50.0


def test_replay_predicts_each_job_from_runs_finished_before_it() -> None:
    """u runs 100 s jobs; each is submitted after the previous one finished. The first three
    are predicted by the policy default (1 h: a key counts from 3 runs), the rest from u's
    history (all 100 s)."""
    rows = "".join(f"j{i},{200 * i},100,1,p,u,batch\n" for i in range(7))
    trace = parse_native("id,submit,duration,gpus,project,user,kind\n" + rows, "t.csv")
    runs = predictions.replay(trace)
    pred, actual = runs["predicted"]
    assert pred.tolist() == pytest.approx([3600.0] * 3 + [100.0] * 4)
    assert actual.tolist() == [100.0] * 7
    p90, _ = runs["plain_p90"]
    assert p90.tolist() == [3600.0] * 3 + [100.0] * 4
    out = predictions.evaluate(trace)
    # 3 of 7 off by 3500 %, 4 exact: the median error is 0
    assert out["predicted"]["mdape"] == pytest.approx(0.0, abs=1e-9)
    assert out["plain_p90"]["mdape"] == 0.0
    assert out["declared"]["mdape"] == pytest.approx(3500.0)  # the default hour for all
    assert out["baseline_mdape"] == 0.0 and out["jobs"] == 7
    assert out["predicted"]["under_pct"] == 0.0


def test_features_beat_the_plain_p90_when_the_slice_tells() -> None:
    """Same user, two kinds of job told apart only by their slice: 1-GPU runs take 100 s,
    4-GPU runs 1000 s. The plain p90 mixes them; the predictor's slice feature does not."""
    rows = []
    for i in range(40):
        gpus, dur = (1, 100) if i % 2 else (4, 1000)
        rows.append(f"j{i},{2000 * i},{dur},{gpus},p,u,batch\n")
    trace = parse_native("id,submit,duration,gpus,project,user,kind\n" + "".join(rows), "t.csv")
    out = predictions.evaluate(trace)
    assert out["predicted"]["mdape"] < 5.0 < out["baseline_mdape"]
