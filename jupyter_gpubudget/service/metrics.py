"""Prometheus metrics, computed from the last cycle's view (and the ledger for counters).

Nothing here touches the ledger: ``/metrics`` is answered on the event loop from what the last
scheduling cycle computed (``loop.View``) and from in-memory reports.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jupyter_gpubudget.core.model import KINDS

if TYPE_CHECKING:
    from .app import GpuBudgetService

NODE_STATES = ("in_service", "draining", "ready_for_repair")
GPU_STATES = ("allocated", "idle", "drained")


class LedgerCollector(Collector):
    def __init__(self, svc: GpuBudgetService) -> None:
        self.svc = svc

    def collect(self):  # noqa: ANN201
        v = self.svc.loop.view
        # base units (promtool's rule): GPU-seconds; divide by 3600 for GPU-hours
        usage = GaugeMetricFamily("gpubudget_usage_gpu_seconds",
                                  "GPU-seconds charged in the window (GPU-hours x 3600)",
                                  labels=["account"])
        grant = GaugeMetricFamily("gpubudget_grant_gpu_seconds",
                                  "GPU-seconds granted per window (GPU-hours x 3600)",
                                  labels=["account"])
        standing = GaugeMetricFamily("gpubudget_standing", "usage / grant", labels=["account"])
        for a, s in sorted(v.standings.items()):
            usage.add_metric([a], s["usage_hours"] * 3600)
            grant.add_metric([a], s["grant_hours"] * 3600)
            standing.add_metric([a], min(s["standing"], 1e12))
        yield from (usage, grant, standing)
        # every project and kind has a series (0 when there is none): dashboards show 0,
        # not "no data"
        projects = sorted({p for p, s in v.standings.items()
                           if self.svc.tree().is_project(p)} | {p for p, _ in v.running}
                          | {p for p, _ in v.pending})
        for name, counts, help_ in (("running", v.running, "Running workloads"),
                                    ("pending", v.pending, "Pending workloads")):
            g = GaugeMetricFamily(f"gpubudget_workloads_{name}", help_,
                                  labels=["project", "kind"])
            for p in projects:
                for k in KINDS:
                    g.add_metric([p, k], counts.get((p, k), 0))
            yield g
        lost = GaugeMetricFamily(
            "gpubudget_preemption_lost_day_gpu_seconds",
            "GPU-seconds the last 24 h of preemptions threw away (drains are finished only "
            "while this stays within gpubudget_drain_loss_budget_gpu_seconds)")
        lost.add_metric([], v.lost_day_gpu_hours * 3600)
        budget = GaugeMetricFamily(
            "gpubudget_drain_loss_budget_gpu_seconds",
            "GPU-seconds a day of preemptions may throw away before no drain is finished "
            "(policy.finish_drain_budget x the cluster's GPU-seconds a day; 0: no budget)")
        budget.add_metric([], v.loss_budget_gpu_hours * 3600)
        yield from (lost, budget)
        pre = CounterMetricFamily("gpubudget_preemptions", "Preemptions (from the ledger)",
                                  labels=["project"])
        for p in sorted(set(projects) | set(v.preemptions)):  # 0 before the first: rate()
            pre.add_metric([p], v.preemptions.get(p, 0))     # sees the first one too
        yield pre
        last = GaugeMetricFamily("gpubudget_last_cycle_timestamp_seconds",
                                 "When the last scheduling cycle ran")
        last.add_metric([], v.at)
        yield last
        yield from self._capacity(v)
        yield self._sessions()
        yield from self.svc_gpu_seconds().families(projects)

    def svc_gpu_seconds(self) -> GpuSecondsTotals:
        t = getattr(self, "_gpu_seconds", None)
        if t is None:
            t = self._gpu_seconds = GpuSecondsTotals(self.svc)
        return t

    def _capacity(self, v):  # noqa: ANN001, ANN202
        gpus = GaugeMetricFamily("gpubudget_gpus", "GPU-equivalents by state: allocated "
                                 "(held by running work), idle (free, in service), drained "
                                 "(free on nodes out of service)", labels=["state"])
        for st in GPU_STATES:
            gpus.add_metric([st], v.gpus.get(st, 0.0))
        yield gpus
        idle = CounterMetricFamily("gpubudget_idle_gpu_seconds", "GPU-seconds since the "
                                   "service started that were in service but held by nobody "
                                   "(unallocated) or held by sessions reported idle "
                                   "(idle_session)", labels=["reason"])
        for reason in ("unallocated", "idle_session"):
            idle.add_metric([reason], v.idle_gpu_hours.get(reason, 0.0) * 3600)
        yield idle
        nodes = GaugeMetricFamily("gpubudget_nodes", "Nodes by state: in_service, draining "
                                  "(unhealthy, work still on it), ready_for_repair "
                                  "(unhealthy and empty)", labels=["state"])
        node = GaugeMetricFamily("gpubudget_node_state", "1 for each node's current state",
                                 labels=["node", "state"])
        counts = dict.fromkeys(NODE_STATES, 0)
        for name, info in sorted(v.nodes.items()):
            counts[info["state"]] = counts.get(info["state"], 0) + 1
            node.add_metric([name, info["state"]], 1)
        for st in NODE_STATES:
            nodes.add_metric([st], counts[st])
        yield nodes
        yield node
        yield self._clusters(v)
        drains = CounterMetricFamily("gpubudget_node_drains", "Nodes drained (found empty "
                                     "while unhealthy: ready for repair), from the ledger")
        drains.add_metric([], v.drains_total)
        yield drains

    def _clusters(self, v):  # noqa: ANN001, ANN202
        """GPUs per named cluster (docs/service.md, "Several clusters"): total and allocated
        after the last cycle; one series per cluster ("default" with one cluster)."""
        g = GaugeMetricFamily("gpubudget_cluster_gpus", "GPUs of each named cluster: total, "
                              "and allocated (GPU-equivalents held by running work)",
                              labels=["cluster", "state"])
        total: dict[str, float] = {}
        held: dict[str, float] = {}
        for spec in self.svc.inventory.nodes:
            total[spec.cluster] = total.get(spec.cluster, 0.0) + len(spec.gpus)
            held[spec.cluster] = held.get(spec.cluster, 0.0) + float(
                v.nodes.get(spec.name, {}).get("allocated", 0.0))
        for name in sorted(total):
            g.add_metric([name, "total"], total[name])
            g.add_metric([name, "allocated"], held[name])
        return g

    def _sessions(self):  # noqa: ANN202
        util = GaugeMetricFamily("gpubudget_session_gpu_utilisation_percent",
                                 "GPU utilisation of a running session's devices, as last "
                                 "reported by the hub's idle sampler (NVML)",
                                 labels=["session", "user", "project"])
        svc = self.svc
        now = svc.clock()
        for wid, (pct, at, user, project) in sorted(svc.session_util.items()):
            if now - at <= svc.session_utilisation_max_age:
                util.add_metric([wid, user, project], pct)
            else:  # a session that ended (or stopped reporting) is forgotten
                svc.session_util.pop(wid, None)
        return util


class GpuSecondsTotals:
    """Charged, measured and busy GPU-seconds per project, as Prometheus counters: the sums of
    the ledger's daily rollups (``usage_daily``: charge intervals once they close, busy and
    measured time as the sampler reports it), read off the event loop — a scrape answers
    what the last read found and starts a new read when the ledger's usage changed or the
    last read is ``max_age`` old. The counters only rise: when the retention prune drops old
    days, the drop is not subtracted (a prune is not a counter reset)."""

    max_age = 30.0

    def __init__(self, svc: GpuBudgetService) -> None:
        self.svc = svc
        self.totals: dict[str, list[float]] = {}  # project -> [charged, measured, busy] s
        self._seen: dict[str, tuple[float, float, float]] = {}
        self._version = -1
        self._read_at = 0.0
        self._reading = False
        self._lock = threading.Lock()

    def read(self) -> None:
        """Read the sums now (blocking: call it off the event loop) and add what rose."""
        from sqlalchemy import func, select

        from jupyter_gpubudget.ledger.models import UsageDailyRow as D

        ledger = self.svc.ledger
        version = ledger.usage_version
        with ledger.ro() as s:
            rows = s.execute(select(D.project, func.sum(D.charged_ms), func.sum(D.measured_ms),
                                    func.sum(D.busy_ms)).group_by(D.project)).all()
        with self._lock:
            for project, *sums in rows:
                now = tuple((x or 0.0) / 1000.0 for x in sums)  # milli-GPU-s -> GPU-s
                before = self._seen.get(project, (0.0, 0.0, 0.0))
                tot = self.totals.setdefault(project, [0.0, 0.0, 0.0])
                for i in range(3):
                    tot[i] += max(0.0, now[i] - before[i])
                self._seen[project] = now  # type: ignore[assignment]
            self._version, self._read_at = version, time.monotonic()

    def _refresh(self) -> None:
        stale = (self._version != self.svc.ledger.usage_version
                 or time.monotonic() - self._read_at >= self.max_age)
        if not stale or self._reading:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a scrape outside the service's loop (a script): read here
            self.read()
            return
        self._reading = True

        def done(_f: object) -> None:
            self._reading = False

        loop.run_in_executor(None, self.read).add_done_callback(done)

    def families(self, projects: list[str]):  # noqa: ANN201
        self._refresh()
        charged = CounterMetricFamily(
            "gpubudget_charged_gpu_seconds", "GPU-seconds charged per project (slice "
            "fraction x wall time of its closed charge intervals), from the ledger",
            labels=["project"])
        measured = CounterMetricFamily(
            "gpubudget_measured_gpu_seconds", "Charged GPU-seconds per project that a busy "
            "sampler watched (busy time is known only for these)", labels=["project"])
        busy = CounterMetricFamily(
            "gpubudget_busy_gpu_seconds", "GPU-seconds per project the devices measured as "
            "computing; idle = measured - busy (unwatched time is unknown, not idle)",
            labels=["project"])
        with self._lock:
            totals = {p: list(t) for p, t in self.totals.items()}
        for p in sorted(set(projects) | set(totals)):  # 0 before the first: rate() sees it
            c, m, b = totals.get(p, (0.0, 0.0, 0.0))
            charged.add_metric([p], c)
            measured.add_metric([p], m)
            busy.add_metric([p], b)
        return charged, measured, busy


def make_registry(svc: GpuBudgetService) -> tuple[CollectorRegistry, Histogram, Histogram]:
    reg = CollectorRegistry()
    reg.register(LedgerCollector(svc))
    cycle = Histogram("gpubudget_cycle_seconds", "Duration of one scheduling cycle",
                      registry=reg, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5,
                                             1, 2.5, 5, 10))
    wait = Histogram("gpubudget_wait_seconds", "Time from submission to start, per kind "
                     "(observed when a workload starts)", ["kind"], registry=reg,
                     buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400,
                              43200, 86400, 259200))
    for k in KINDS:  # every kind has a series from the start
        wait.labels(k)
    return reg, cycle, wait
