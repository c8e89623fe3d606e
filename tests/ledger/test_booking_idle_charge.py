"""The idle part of a booking is charged to its project (policy ``reservation_idle_charge``,
default half): each stretch of the window in which nothing held a booked GPU, times the
fraction, exact to the second; a cancelled booking only up to its cancellation; once."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import BudgetError, load_budgets
from jupyter_gpubudget.core.inventory import Inventory, make_node
from jupyter_gpubudget.ledger import Ledger, connect, upgrade
from jupyter_gpubudget.ledger.bookings import IDLE_CHARGE, book, cancel, charge_idle, idle_gaps

BUDGETS = load_budgets("accounts:\n  course: {grant: 100, members: [ann]}\n"
                       "  other: {grant: 100, members: [bob]}\n", "b.yaml")
INV = Inventory((make_node("n0", "H100-80GB", 2), make_node("n1", "H100-80GB", 2)))
T = 1_800_000_000.0
H = 3600.0


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    upgrade(url)
    engine = connect(url)
    led = Ledger(engine)
    led.sync_budgets(BUDGETS, T - 10 * H)
    yield led
    engine.dispose()


def run(led: Ledger, project: str, user: str, node: str, gpu: int, a: float, b: float) -> str:
    w = led.submit(project=project, user=user, kind="batch", now=a - 1,
                   request={"kind": "gpu", "gpus": 1}, command=["true"])
    led.start(w.id, placement=[{"node": node, "gpu": gpu, "kind": "gpu", "milli": 1000}],
              milli=1000, backed=True, protected_until=None, now=a)
    led.stop(w.id, now=b, state="done", closed_by="exit")
    return w.id


def idle_charges(led: Ledger, bid: str) -> list[tuple[float, float, int, str]]:
    return [(c.start - T, c.end - T, c.milli, c.project) for c in led.charges(workload=bid)]


def test_idle_gaps_are_the_window_less_what_held_the_gpu():
    assert idle_gaps([], 0, 10) == [(0, 10)]
    assert idle_gaps([(2, 4), (3, 5), (7, None)], 0, 10) == [(0, 2), (5, 7)]
    assert idle_gaps([(-5, 1), (9, 20)], 0, 10) == [(1, 9)]


def test_a_bookings_idle_part_is_charged_at_the_policys_share_once(ledger):
    """2 GPUs booked over [0, 2 h). The course's job holds GPU 0 from 0:30 to 1:30; another
    project's job (still there at the window's start, preempted) holds GPU 1 to 0:00:10. Idle:
    GPU 0 0:00–0:30 and 1:30–2:00 (1 h), GPU 1 0:00:10–2:00 (1 h 59 min 50 s): 10,790 s
    booked and idle, at half: 5,395 GPU-seconds = 1.49861 GPU-hours, charged to the course."""
    bk = book(ledger, INV, project="course", gpus=2, start=T, end=T + 2 * H, by="root",
              now=T - H, nodes=["n0"])
    assert sorted(bk.gpus) == ["n0:0", "n0:1"]
    run(ledger, "course", "ann", "n0", 0, T + 0.5 * H, T + 1.5 * H)
    run(ledger, "other", "bob", "n0", 1, T - H, T + 10)
    assert charge_idle(ledger, T + 2 * H - 1, 0.5) == []  # the window is not over
    assert charge_idle(ledger, T + 2 * H, 0.5) == [bk.id]
    assert idle_charges(ledger, bk.id) == [(0, 0.5 * H, 500, "course"),
                                           (1.5 * H, 2 * H, 500, "course"),
                                           (10, 2 * H, 500, "course")]
    charged = sum((c.end - c.start) * c.milli / 1000 for c in ledger.charges(workload=bk.id))
    assert charged == 5395.0
    assert {c.closed_by for c in ledger.charges(workload=bk.id)} == {IDLE_CHARGE}
    row = ledger.get(bk.id)
    assert (row.kind, row.state, row.user, row.project) == ("booking", "done",
                                                            f"booking:{bk.id}", "course")
    (d,) = ledger.decisions(kind="booking-charge")
    assert d.detail["idle_gpu_hours"] == round(10790 / H, 6)
    assert d.detail["charged_gpu_hours"] == round(5395 / H, 6)
    # it counts in the project's usage like any charge
    usage = {p: ms for p, _a, _b, ms in ledger.usage_for_window(T - H)}
    assert "course" in usage
    assert charge_idle(ledger, T + 3 * H, 0.5) == []  # once
    assert len(ledger.charges(workload=bk.id)) == 3


def test_a_cancelled_booking_charges_only_the_idle_time_already_passed(ledger):
    """Cancelled 45 min into its 2 h window, 2 idle GPUs: 2 × 2,700 s × 0.25 = 1,350
    GPU-seconds. One cancelled before its window charges nothing, and neither does a
    share of 0 (the booking is still marked charged)."""
    a = book(ledger, INV, project="course", gpus=2, start=T, end=T + 2 * H, by="root",
             now=T - H, nodes=["n1"])
    b = book(ledger, INV, project="course", gpus=1, start=T + 5 * H, end=T + 6 * H,
             by="root", now=T - H)
    c = book(ledger, INV, project="course", gpus=1, start=T + 7 * H, end=T + 8 * H,
             by="root", now=T - H)
    cancel(ledger, a.id, by="root", now=T + 0.75 * H)
    cancel(ledger, b.id, by="root", now=T + H)
    assert charge_idle(ledger, T + 0.75 * H + 5, 0.25) == [a.id]
    assert idle_charges(ledger, a.id) == [(0, 0.75 * H, 250, "course")] * 2
    assert sum((x.end - x.start) * x.milli / 1000
               for x in ledger.charges(workload=a.id)) == 1350.0
    assert charge_idle(ledger, T + 9 * H, 0.0) == [c.id]
    assert ledger.get(b.id) is None and ledger.charges(workload=c.id) == []


def test_the_policy_key_defaults_to_half_and_refuses_a_bad_value():
    assert BUDGETS.policy.reservation_idle_charge == 0.5
    off = load_budgets("policy: {reservation_idle_charge: 0}\naccounts:\n  a: {grant: 1}\n")
    assert off.policy.reservation_idle_charge == 0.0
    with pytest.raises(BudgetError, match=r"b.yaml:1: policy.reservation_idle_charge: must "
                                          r"be ≤ 1, got 1.5"):
        load_budgets("policy: {reservation_idle_charge: 1.5}\naccounts:\n  a: {grant: 1}\n",
                     "b.yaml")
