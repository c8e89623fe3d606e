"""What a scheduler is built from: the cluster's state as plain data, and its capacity model.

:class:`ClusterState` is what the service reads from its ledger (and the simulator keeps)
for one cycle; :func:`new_cluster` and :func:`load_running` turn its inventory and running
work into the capacity model; :func:`paused_gc` runs a cycle without the cyclic collector.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .accounts import AccountTree
from .capacity import CapacityError, Cluster
from .inventory import Inventory
from .model import ChargeInterval, Policy, RuntimeHistory, Workload
from .reservations import Booking


@dataclass(slots=True)
class ClusterState:
    """Everything one cycle needs, as plain data (what the service reads from its ledger)."""

    accounts: AccountTree
    inventory: Inventory
    policy: Policy = field(default_factory=Policy)
    running: Sequence[Workload] = ()
    pending: Sequence[Workload] = ()
    charges: Sequence[ChargeInterval] = ()
    history: RuntimeHistory | None = None
    unhealthy: frozenset[str] = frozenset()
    #: (time, GPU-hours thrown away) of each preemption in the last ``LOSS_WINDOW``
    #: (``Policy.finish_drain_budget``; the service reads them from its decision log)
    recent_losses: Sequence[tuple[float, float]] = ()
    #: work that pending work runs after (``Workload.after``) and has ended: whether it
    #: succeeded (core/holds.py)
    finished: Mapping[str, bool] = field(default_factory=dict)
    #: advance reservations: GPUs booked for a project over a window (core/reservations.py)
    bookings: Sequence[Booking] = ()


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for one cycle. A cycle allocates ~10^5
    short-lived objects over a large live state, which triggers full collections that cost
    as much as the cycle itself; reference counting frees nearly everything anyway, and the
    collector runs as usual once the cycle is over."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def new_cluster(inventory: Inventory, unhealthy: set[str], policy: Policy) -> Cluster:
    """An empty capacity model of ``inventory``, with the policy's placement rules."""
    c = Cluster(inventory, unhealthy)
    c.whole_gpu_on_mig = policy.whole_gpu_on_mig
    c.mig_first = policy.whole_gpu_on_mig and policy.mig_first
    c.mps_on_mig = policy.mps_on_mig
    c.mps_mig_first = policy.mps_on_mig and policy.mps_mig_first
    c.gang_on_mig = policy.gang_on_mig
    c.gang_on_mig_spare = policy.gang_on_mig_spare
    return c


def load_running(cluster: Cluster, running: dict[str, Workload],
                 inconsistent: list[tuple[str, str]], fresh: Callable[[], Cluster],
                 kept_unhealthy: set[str] | None = None) -> Cluster:
    """``cluster`` with the placements of ``running`` work allocated; the capacity model to
    use from now on. One inconsistent record must not stop scheduling for everyone: when
    they do not all fit, they are loaded one by one into a ``fresh()`` model, and each that
    does not fit beside those before it leaves ``running`` for ``inconsistent`` as
    (id, why). With ``kept_unhealthy`` (the nodes out of service), ``cluster`` is a model
    kept from an earlier cycle, brought to ``running`` (:meth:`Cluster.resync`)."""
    try:
        if kept_unhealthy is not None:
            cluster.resync([(wid, w.placement) for wid, w in running.items()
                            if w.placement is not None], kept_unhealthy)
        else:
            cluster.load((wid, w.placement) for wid, w in running.items()
                         if w.placement is not None)
        return cluster
    except CapacityError:
        cluster = fresh()
        for wid, w in list(running.items()):
            assert w.placement is not None
            try:
                cluster.allocate(wid, w.placement)
            except CapacityError as e:
                del running[wid]
                inconsistent.append((wid, str(e)))
        return cluster
