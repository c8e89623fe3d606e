"""The service's own scheduling loop (ledger on SQLite, the pure core deciding) on a
KubernetesBackend, for the tests and the scale bench: :func:`make_loop` discovers the
inventory from the cluster's Node objects; :func:`run_until` cycles it until a condition
holds."""

from __future__ import annotations

import time

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.loop import SchedulingLoop
from tests.fixtures.smallcluster import TWO_PROJECTS as BUDGETS


def make_loop(tmp_path, backend):  # noqa: ANN001, ANN201
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    upgrade(url)
    ledger = Ledger(connect(url))
    budgets = load_budgets(BUDGETS, "budgets.yaml")
    ledger.sync_budgets(budgets, time.time(), "budgets.yaml")
    inventory = backend.discover_inventory()  # from the Node objects
    return ledger, SchedulingLoop(ledger, lambda: budgets.accounts, inventory, lambda: budgets.policy,
                                  backend)


def run_until(loop: SchedulingLoop, pred, what: str, timeout: float = 40):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        loop.cycle()
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
