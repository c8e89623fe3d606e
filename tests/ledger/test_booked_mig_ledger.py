"""Bookings of MIG instances through the ledger (``book(..., mig_profile=...)``, what the
REST ``POST /reservations`` with ``mig_profile`` does): the chosen instances are stored
with their memory slots and come back to the core as the booking's instances; what
cannot be booked is a 400 naming its field, and nothing is written."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.ledger import bookings as store
from jupyter_gpubudget.ledger.store import LedgerError

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
