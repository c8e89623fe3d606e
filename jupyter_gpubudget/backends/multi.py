"""Several named clusters, one backend each, behind the one ``Backend`` the service drives.

The service schedules every cluster with one core and one budget tree (docs/service.md,
"Several clusters"); a decision's placement names nodes, and the nodes name their cluster, so
each launch goes to that cluster's backend. Stop, status and logs go where the attempt was
launched: remembered here, and after a restart read back from the ledger, which records the
cluster each workload started on (``locate``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyter_gpubudget.core.inventory import Inventory

from .base import Backend, BackendStatus, Launch, LogChunk


class ClusterBackends(Backend):
    """Dispatches by cluster: ``parts`` maps a cluster's name to its backend; ``node_cluster``
    maps each node to its cluster (node names are unique across clusters)."""

    name = "clusters"

    def __init__(self, parts: dict[str, Backend], node_cluster: dict[str, str],
                 locate: Callable[[str], str | None] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        if not parts:
            raise ValueError("clusters: at least one cluster is needed")
        self.parts = dict(parts)
        self.node_cluster = dict(node_cluster)
        #: workload id -> the cluster it started on, from the ledger (set by the service)
        self.locate = locate
        self._where: dict[str, str] = {}
        # a stop is synchronous only if it is on every cluster
        self.synchronous_stop = all(b.synchronous_stop for b in self.parts.values())
        self.stop_grace = max(float(getattr(b, "stop_grace", 10.0))
                              for b in self.parts.values())
        intervals = [b.usage_check_interval for b in self.parts.values()
                     if b.usage_check_interval]
        self.usage_check_interval = min(intervals) if intervals else 0.0

    # ------------------------------------------------------------------ where things are
    def cluster_of_placement(self, placement: list[dict]) -> str:
        names = {self.node_cluster.get(str(s.get("node")), "") for s in placement}
        if len(names) != 1 or "" in names:
            raise ValueError(f"placement on nodes {[s.get('node') for s in placement]} is not "
                             f"in exactly one cluster ({', '.join(self.parts)})")
        return names.pop()

    def cluster_of(self, workload: str) -> str | None:
        where = self._where.get(workload)
        if where is None and self.locate is not None:
            where = self.locate(workload)
            if where in self.parts:
                self._where[workload] = where
        return where if where in self.parts else None

    def _for(self, workload: str, attempt: int) -> Backend:
        """The backend an attempt went to; unknown (nothing recorded): the one that knows it."""
        where = self.cluster_of(workload)
        if where is not None:
            return self.parts[where]
        for b in self.parts.values():
            if b.status(workload, attempt).launched:
                return b
        return next(iter(self.parts.values()))

    @property  # type: ignore[override]
    def on_exit(self) -> Any:
        return self._on_exit if hasattr(self, "_on_exit") else None

    @on_exit.setter
    def on_exit(self, fn: Any) -> None:
        self._on_exit = fn
        for b in self.parts.values():
            b.on_exit = fn

    # ------------------------------------------------------------------ the interface
    def fence(self, token: int | None) -> None:
        self.fence_token = token
        for b in self.parts.values():
            b.fence(token)

    def use_ledger(self, ledger: Any) -> None:
        for b in self.parts.values():
            b.use_ledger(ledger)

    def launch(self, launch: Launch) -> str:
        where = self.cluster_of_placement(launch.placement)
        self._where[launch.workload] = where
        return self.parts[where].launch(launch)

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        return self._for(workload, attempt).stop(workload, attempt)

    def status(self, workload: str, attempt: int) -> BackendStatus:
        return self._for(workload, attempt).status(workload, attempt)

    def stop_orphan(self, workload: str, attempt: int) -> None:
        """Every cluster whose engine lists the attempt as an orphan stops it (a replica
        that no longer led may have launched it anywhere)."""
        for b in self.parts.values():
            if (workload, attempt) in b.orphans(set()):
                b.stop_orphan(workload, attempt)

    def read_log(self, workload: str, attempt: int, offset: int, limit: int) -> LogChunk | None:
        return self._for(workload, attempt).read_log(workload, attempt, offset, limit)

    def notify(self, workload: str, attempt: int, signal_name: str) -> str | None:
        """A running batch job's ``warn_signal``, sent by the backend of the cluster it runs
        on: None when sent, else why not."""
        b = self._for(workload, attempt)
        notify = getattr(b, "notify", None)
        if notify is None:
            return f"the {b.name} backend does not send signals ahead"
        return str(notify(workload, attempt, signal_name) or "") or None

    def check_command(self, command: list[str]) -> str | None:
        """A job may start on any cluster: every backend must accept its command."""
        for name, b in self.parts.items():
            why = b.check_command(command)
            if why:
                return f"{why} (cluster {name})"
        return None

    def resolve_command(self, command: list[str]) -> list[str]:
        for b in self.parts.values():
            command = b.resolve_command(command)
        return command

    def check_user(self, user: str) -> str | None:
        for name, b in self.parts.items():
            why = b.check_user(user)
            if why:
                return f"{why} (cluster {name})"
        return None

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for b in self.parts.values():
            out.extend(x for x in b.orphans(running) if x not in out)
        return out

    def use_inventory(self, inventory: Any) -> None:
        """Each backend gets its own cluster's nodes."""
        for name, b in self.parts.items():
            b.use_inventory(Inventory(tuple(n for n in inventory.nodes if n.cluster == name),
                                      inventory.source))

    def node_health(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for b in self.parts.values():
            out.update(b.node_health())
        return out

    def drain_node(self, node: str, reason: str) -> None:
        where = self.node_cluster.get(node)
        if where in self.parts:
            self.parts[where].drain_node(node, reason)

    def undrain_node(self, node: str) -> None:
        where = self.node_cluster.get(node)
        if where in self.parts:
            self.parts[where].undrain_node(node)

    def reconcile_usage(self, intervals: list[tuple[str, int, float, float, str]]
                        ) -> list[dict]:
        """Each cluster's engine compares the intervals of the work that ran on it (a batch
        job of this dispatcher counts as that backend's own); sessions go to every engine,
        which compares those it has a job for."""
        out: list[dict] = []
        for name, b in self.parts.items():
            if not b.usage_check_interval:
                continue
            mine = []
            for wid, seq, start, end, backend in intervals:
                if backend == self.name:
                    if self.cluster_of(wid) != name:
                        continue
                    backend = b.name
                mine.append((wid, seq, start, end, backend))
            for m in b.reconcile_usage(mine):
                out.append({**m, "cluster": name})
        return out

    def gpu_busy(self, intervals: list[tuple[str, int, float, float, str]]
                 ) -> list[tuple[str, float, float, float, str]]:
        """Each cluster's engine reads its own work's GPU accounting (as for
        :meth:`reconcile_usage`)."""
        out: list[tuple[str, float, float, float, str]] = []
        for name, b in self.parts.items():
            mine = []
            for wid, seq, start, end, backend in intervals:
                if backend == self.name:
                    if self.cluster_of(wid) != name:
                        continue
                    backend = b.name
                mine.append((wid, seq, start, end, backend))
            out.extend(b.gpu_busy(mine))
        return out
