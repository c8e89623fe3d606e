"""The ledger: accounts, versioned grants, workloads, charge intervals, snapshots, decisions.

SQLAlchemy 2 models with Alembic migrations; SQLite (WAL) by default, PostgreSQL supported.
Every state change is one transaction, so a crash at any point leaves either the old or the
new state; open charge intervals carry a checkpoint so that a crash loses at most the tail
since the last checkpoint, which :meth:`Ledger.reconcile` settles on restart.
"""

from .db import connect, upgrade
from .store import Ledger, LedgerError

__all__ = ["Ledger", "LedgerError", "connect", "upgrade"]
