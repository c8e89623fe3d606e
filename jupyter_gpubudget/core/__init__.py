"""The pure fair-share scheduling core: no I/O, no Jupyter, deterministic.

Everything that decides lives here; the service, the spawner and the simulator only feed it
state and carry out its decisions. Entry point: :func:`schedule` (and :class:`Scheduler` for
the incremental path).
"""

from .accounts import Account, AccountTree, BudgetError, Budgets, load_budgets
from .explain import queue_order
from .inventory import GpuSpec, Inventory, NodeSpec, load_inventory, make_node
from .model import (
    ChargeInterval,
    Decision,
    Drain,
    Placement,
    Policy,
    Preempt,
    Reserve,
    RuntimeHistory,
    SliceAlloc,
    SliceRequest,
    Start,
    Workload,
)
from .offer import Forecast, Quoter, forecast
from .scheduler import ClusterState, Scheduler, schedule
from .whatif import standings
from .yamlnodes import ConfigError

__all__ = [
    "Account", "AccountTree", "BudgetError", "Budgets", "load_budgets",
    "GpuSpec", "Inventory", "NodeSpec", "load_inventory", "make_node",
    "ChargeInterval", "Decision", "Drain", "Placement", "Policy", "Preempt", "Reserve",
    "RuntimeHistory", "SliceAlloc", "SliceRequest", "Start", "Workload",
    "ClusterState", "Scheduler", "queue_order", "schedule", "standings",
    "Forecast", "Quoter", "forecast",
    "ConfigError",
]
