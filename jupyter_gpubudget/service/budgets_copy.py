"""The one budgets file that service replicas on a PostgreSQL ledger agree on.

The ledger keeps a copy of it with the lease (``service_leader.budgets_digest``,
``budgets_source``, ``budgets_text``), written by the leader in the same transaction that
mirrors its accounts and grants (:meth:`Ledger.sync_budgets`). The rules
(``GpuBudgetService``):

- a replica that takes the lease when it starts, or whose file changes while it leads,
  writes its file (that is how an admin deploys a new one);
- a replica that starts as a standby with another file (another SHA-256) refuses to start,
  naming both files and digests — or, with ``budgets_from_ledger``, follows the ledger's copy;
- a standby authorises from the ledger's copy, read again as it follows the leader;
- a replica taking over whose file differs from the copy keeps the copy (logged): members
  and grants — an admin's grants set through the API included — are not rewritten.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import select

from jupyter_gpubudget.ledger import Ledger
from jupyter_gpubudget.ledger.models import LeaderRow


class BudgetsDisagree(Exception):
    """A replica's budgets file is not the one the ledger's replicas agreed on."""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Copy:
    """The ledger's copy: digest, where it came from (file and replica), its text."""

    digest: str
    source: str
    text: str


def read(ledger: Ledger) -> Copy | None:
    """The copy the ledger keeps (None: none written yet)."""
    with ledger.ro() as s:
        row = s.execute(select(LeaderRow.budgets_digest, LeaderRow.budgets_source,
                               LeaderRow.budgets_text).where(LeaderRow.id == 1)).first()
    if row is None or row[0] is None:
        return None
    return Copy(row[0], row[1] or "", row[2] or "")


def disagree_message(path: str, mine: str, copy: Copy) -> str:
    return (f"budgets file {path} (sha256 {mine}) is not the one the service replicas on "
            f"this ledger agreed on: {copy.source} (sha256 {copy.digest}). Give every "
            "replica the same budgets file, or set GpuBudgetService.budgets_from_ledger = "
            "True to follow the ledger's copy")
