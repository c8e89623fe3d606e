"""The first quote after a cycle never waits for the forecast's replay: the service's
scheduling loop (ledger on SQLite, the pure core deciding, the real local launcher running the
jobs as their users) warms each new forecast in the background, so that without any request
it is replayed to its end, and a quote or a queue page view then replays nothing."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.backends.local import LocalBackend
from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.forecast import LazyForecast
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.core.offer import request_for
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.smallcluster import ONE_GPU_NODE as INVENTORY
from tests.fixtures.smallcluster import TWO_PROJECTS as BUDGETS
from tests.fixtures.unixusers import TEMPLATE, ensure_accounts


@pytest.fixture
def setup(tmp_path):  # noqa: ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    as_user = {"unix_user_template": TEMPLATE} if ensure_accounts(["alice"]) else {}
    backend = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=2, **as_user)
    loop = SchedulingLoop(ledger, lambda: budgets.accounts, load_inventory(INVENTORY),
                          lambda: budgets.policy, backend)
    try:
        yield ledger, loop
    finally:
        loop.wait_warmed(60)
        for wid, attempt in backend.orphans(set()):
            backend.stop(wid, attempt)
        ledger.dispose()


def submit(ledger: Ledger) -> str:
    return ledger.submit(project="lattice", user="alice", kind="batch", now=time.time(),
                         request={"kind": "gpu", "gpus": 1},
                         command=["/bin/sh", "-c", "exec sleep 60"], backend="local").id


def test_a_new_forecast_is_replayed_without_a_request_and_a_quote_then_replays_nothing(setup):
    ledger, loop = setup
    running = submit(ledger)
    queued = [submit(ledger) for _ in range(3)]  # behind it on the one GPU
    loop.cycle()
    assert ledger.get(running).state == "running"
    fc = loop.view.quoter.forecast
    assert isinstance(fc, LazyForecast)
    # nothing asked of the view: the forecast is warmed in the background
    assert loop.wait_warmed(60), "the forecast's warming did not end in 60 s"
    assert fc.done, f"the forecast was not replayed without a request ({fc.fills} fills)"
    fills = fc.fills
    assert fills >= len(queued)  # (each queued job starts in a step of its own)
    now = time.time()
    quote = loop.view.quoter.quote("alice", "lattice", "gpu:1", request_for("gpu:1"), 3600.0,
                                   now)
    starts = {w: loop.view.reservations[w] for w in queued}  # the queue page's starts
    assert fc.fills == fills, "the quote or the queue view replayed the forecast again"
    assert quote["predicted_start"] is not None and not quote["starts_now"]
    assert sorted(starts.values()) == [starts[w] for w in queued]  # in queue order



def test_a_failed_warming_is_logged_once_and_changes_nothing(setup, monkeypatch, caplog):
    """A fake fault: the warming raises (a replay that fails cannot be made to happen on the
    real core at will). The cycles go on, the failure is logged once for the two forecasts
    whose warming failed, and a quote still replays what it needs itself."""
    ledger, loop = setup
    submit(ledger)
    queued = submit(ledger)

    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("replay failed")

    monkeypatch.setattr("jupyter_gpubudget.service.loop.warm", broken)
    loop.forecast_interval = 0.0  # a new forecast each cycle
    with caplog.at_level("ERROR", logger="gpubudget.loop"):
        loop.cycle()
        assert loop.wait_warmed(60)
        loop.cycle()
        assert loop.wait_warmed(60)
    failed = [r for r in caplog.records if "warming the forecast failed" in r.getMessage()]
    assert len(failed) == 1
    fc = loop.view.quoter.forecast
    assert not fc.done and fc.fills == 0  # nothing replayed by the warming
    quote = loop.view.quoter.quote("alice", "lattice", "gpu:1", request_for("gpu:1"), 3600.0,
                                   time.time())
    assert quote["predicted_start"] is not None
    assert loop.view.reservations[queued] >= loop.view.at
