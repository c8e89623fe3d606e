"""Prometheus metrics, computed from the last cycle's view (and the ledger for counters).

Nothing here touches the ledger: ``/metrics`` is answered on the event loop from what the last
scheduling cycle computed (``loop.View``) and from in-memory reports.
"""

from __future__ import annotations

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
