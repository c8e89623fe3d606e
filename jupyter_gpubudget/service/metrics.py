"""Prometheus metrics, computed from the last cycle's view (and the ledger for counters)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .app import GpuBudgetService


class LedgerCollector(Collector):
    def __init__(self, svc: GpuBudgetService) -> None:
        self.svc = svc

    def collect(self):  # noqa: ANN201
        v = self.svc.loop.view
        usage = GaugeMetricFamily("gpubudget_usage_gpu_hours",
                                  "GPU-hours charged in the window", labels=["account"])
        grant = GaugeMetricFamily("gpubudget_grant_gpu_hours",
                                  "GPU-hours granted per window", labels=["account"])
        standing = GaugeMetricFamily("gpubudget_standing", "usage / grant", labels=["account"])
        for a, s in sorted(v.standings.items()):
            usage.add_metric([a], s["usage_hours"])
            grant.add_metric([a], s["grant_hours"])
            standing.add_metric([a], min(s["standing"], 1e12))
        yield from (usage, grant, standing)
        for name, counts, help_ in (("running", v.running, "Running workloads"),
                                    ("pending", v.pending, "Pending workloads")):
            g = GaugeMetricFamily(f"gpubudget_workloads_{name}", help_,
                                  labels=["project", "kind"])
            for (p, k), n in sorted(counts.items()):
                g.add_metric([p, k], n)
            yield g
        pre = CounterMetricFamily("gpubudget_preemptions", "Preemptions (from the ledger)",
                                  labels=["project"])
        for p, n in sorted(v.preemptions.items()):
            pre.add_metric([p], n)
        yield pre
        last = GaugeMetricFamily("gpubudget_last_cycle_timestamp_seconds",
                                 "When the last scheduling cycle ran")
        last.add_metric([], v.at)
        yield last


def make_registry(svc: GpuBudgetService) -> tuple[CollectorRegistry, Histogram]:
    reg = CollectorRegistry()
    reg.register(LedgerCollector(svc))
    cycle = Histogram("gpubudget_cycle_seconds", "Duration of one scheduling cycle",
                      registry=reg, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5,
                                             1, 2.5, 5, 10))
    return reg, cycle
