"""Bookings of MIG instances through the ledger (``book(..., mig_profile=...)``, what the
REST ``POST /reservations`` with ``mig_profile`` does): the chosen instances are stored
with their memory slots and come back to the core as the booking's instances; what
cannot be booked is a 400 naming its field, and nothing is written."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.ledger import bookings as store
from jupyter_gpubudget.ledger.store import LedgerError
from jupyter_gpubudget.service.handlers.reservations import booking_json

from ..core.test_booked_mig import mig_inventory
from .test_booking_idle_charge import BUDGETS, H, T, ledger  # noqa: F401 - the fixture

INV = mig_inventory(1, "sevens")


def test_mig_instances_are_booked_stored_and_read_back(ledger):  # noqa: F811
    bk = store.book(ledger, INV, project="course", gpus=3, mig_profile="1g.10gb", start=T,
                    end=T + 2 * H, by="root", now=T - H)
    assert [(d["node"], d["gpu"], d["profile"], d["start"]) for d in bk.gpus] == \
        [("n0", 1, "1g.10gb", 0), ("n0", 1, "1g.10gb", 1), ("n0", 1, "1g.10gb", 2)]
    whole = store.book(ledger, INV, project="other", gpus=1, start=T, end=T + 2 * H,
                       by="root", now=T - H)
    assert whole.gpus == ["n0:0"]
    got = {b.id: b for b in store.live_bookings(ledger, T)}
    assert got[bk.id].gpus == () and [m.key for m in got[bk.id].mig] == \
        ["n0:1:1g.10gb@0", "n0:1:1g.10gb@1", "n0:1:1g.10gb@2"]
    assert got[bk.id].mig[1].mask == 0b10
    assert got[whole.id].gpus == (("n0", 0),) and got[whole.id].mig == ()
    assert store.key_node(bk.gpus[0]) == "n0" and store.key_node("n0:0") == "n0"
    # as the REST and the CLI show them: the profile, or none for whole GPUs
    assert booking_json(bk, T)["mig_profile"] == "1g.10gb"
    assert booking_json(whole, T)["mig_profile"] is None


@pytest.mark.parametrize(("kw", "field", "match"), [
    ({"mig_profile": "9g.99gb", "gpus": 1}, "mig_profile", r"mig_profile: no MIG GPU offers"),
    ({"mig_profile": "3g.40gb", "gpus": 1}, "mig_profile", r"profiles: 1g.10gb"),
    ({"mig_profile": "1g.10gb", "gpus": 5}, "gpus",
     r"gpus: 4 1g.10gb instances are free for this window, 5 asked; booked there in this "
     r"window: bk-"),
    ({"mig_profile": "1g.10gb", "gpus": 1, "nodes": ["n7"]}, "nodes", "no node 'n7'"),
    ({"mig_profile": "1g.10gb", "gpus": 1, "start": T - 2 * H}, "start", "in the past"),
])
def test_what_cannot_be_booked_is_a_400_naming_its_field(ledger, kw, field, match):  # noqa: F811
    store.book(ledger, INV, project="course", gpus=3, mig_profile="1g.10gb", start=T,
               end=T + 2 * H, by="root", now=T - H)
    before = [r.id for r in store.bookings(ledger)]
    args = {"project": "other", "start": T + H, "end": T + 3 * H, "by": "root",
            "now": T - H, **kw}
    with pytest.raises(LedgerError, match=match) as e:
        store.book(ledger, INV, **args)
    assert (e.value.status, e.value.field) == (400, field)
    assert [r.id for r in store.bookings(ledger)] == before


def test_the_idle_part_of_booked_instances_is_charged_at_their_size(ledger):  # noqa: F811
    """Three 1g.10gb (each 143 milli-GPU) booked over [0, 2 h); the course's job holds the
    first from 0:30 to 1:30. Idle: 1 h of the first, 2 h of each other: 5 instance-hours,
    0.715 GPU-hours; at half, 72 milli-GPU (0.5 × 143, rounded) an hour: 0.36 GPU-hours."""
    bk = store.book(ledger, INV, project="course", gpus=3, mig_profile="1g.10gb", start=T,
                    end=T + 2 * H, by="root", now=T - H)
    w = ledger.submit(project="course", user="ann", kind="batch", now=T,
                      request={"kind": "mig", "gpus": 1, "profile": "1g.10gb"},
                      command=["true"])
    ledger.start(w.id, placement=[{"node": "n0", "gpu": 1, "kind": "mig", "milli": 143,
                                   "mig_start": 0, "profile": "1g.10gb"}],
                 milli=143, backed=True, protected_until=None, now=T + 0.5 * H)
    ledger.stop(w.id, now=T + 1.5 * H, state="done", closed_by="exit")
    assert store.charge_idle(ledger, T + 3 * H, 0.5) == [bk.id]
    got = sorted((c.start - T, c.end - T, c.milli) for c in ledger.charges(workload=bk.id))
    assert got == [(0.0, 0.5 * H, 72), (0.0, 2 * H, 72), (0.0, 2 * H, 72),
                   (1.5 * H, 2 * H, 72)]
    assert sum((e - a) * m for a, e, m in got) / 1000 / H == pytest.approx(0.36)
