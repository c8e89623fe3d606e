"""A member's usage inside a project, as the service's cycle sees it, counts their closed
work: the state a cycle is built from splits each hourly rollup of closed intervals among the
users charged in it (members' limits and the member level of the ranking read it); the
project's figures stay those of the rollups. On SQLite and PostgreSQL (``db_url``)."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.core.model import HOUR, Policy
from jupyter_gpubudget.core.scheduler import Scheduler
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.service.state import build_state

BUDGETS = """
accounts:
  physics:
    grant: 1000
    children:
      lattice: {grant: 600, members: [bob, carol], member_limits: {bob: {gpu_hours: 5}}}
      astro: {grant: 400, members: [dave]}
"""
NOW = 1_000 * HOUR


@pytest.fixture
def ledger(db_url):  # noqa: ANN001, ANN201
    upgrade(db_url)
    engine = connect(db_url)
    led = Ledger(engine)
    led.sync_budgets(load_budgets(BUDGETS), now=1.0)
    yield led
    engine.dispose()


def _ran(led: Ledger, project: str, user: str, milli: int, start: float, end: float) -> None:
    w = led.submit(project=project, user=user, kind="batch", request={"gpus": milli // 1000},
                   now=start)
    led.start(w.id, placement=[], milli=milli, backed=True, protected_until=None, now=start)
    led.stop(w.id, now=end, state="done", closed_by="exit")


def test_a_members_closed_work_counts_as_theirs_and_the_project_total_is_unchanged(ledger):
    # bob: 2 GPUs for 3.5 h; carol: 1 GPU for 2 h overlapping his hours; dave in astro
    _ran(ledger, "lattice", "bob", 2000, NOW - 10 * HOUR + 1800, NOW - 6 * HOUR)
    _ran(ledger, "lattice", "carol", 1000, NOW - 8 * HOUR, NOW - 6 * HOUR)
    _ran(ledger, "astro", "dave", 1000, NOW - 5 * HOUR, NOW - 4 * HOUR)
    tree = load_budgets(BUDGETS).accounts
    inv = Inventory((make_node("n1", "H100-80GB", 8),))
    state, _ = build_state(ledger, tree, inv, Policy(window=7 * 24 * HOUR), NOW)
    st = Scheduler.from_state(state).standings(NOW)
    assert st.member_usage[("lattice", "bob")] == pytest.approx(7.0)
    assert st.member_usage[("lattice", "carol")] == pytest.approx(2.0)
    assert st.member_usage[("astro", "dave")] == pytest.approx(1.0)
    assert st.usage["lattice"] == pytest.approx(9.0) and st.usage["astro"] == pytest.approx(1.0)
    assert sum(c.milli * (c.end - c.start) for c in state.charges if c.project == "lattice") \
        == pytest.approx(9.0 * 1000 * HOUR)
