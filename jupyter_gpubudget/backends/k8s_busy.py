"""How busy a Kubernetes workload's GPUs are, from NVIDIA's DCGM exporter.

On Kubernetes the service runs on no GPU node, so it cannot ask NVML; the cluster's
``dcgm-exporter`` (part of the GPU Operator) reads every GPU on every node and labels each
reading with the pod, namespace and container that holds the GPU. The Kubernetes backend's
``dcgm_metrics_url`` names a page in Prometheus's text format holding those readings: the
exporter's own ``/metrics`` (a single node's, or a Service in front of them), or Prometheus's
``/federate?match[]={__name__=~"DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_GPU_UTIL"}`` for the
whole cluster. Each sampling tick reads it once and, per running workload, averages the
readings of its pods' GPUs:

- ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (0..1, the share of time the graphics engine was active;
  a MIG instance's own where the exporter reports per instance), else
- ``DCGM_FI_DEV_GPU_UTIL`` (percent of the sample period in which a kernel ran).

A workload with a pod the page says nothing about gives no reading (its time stays
*unknown*, never 0), as with NVML. The samples ``(workload, start, end, fraction, "dcgm")``
go to ``Ledger.record_busy`` like NVML's. A page that cannot be read or parsed gives no
samples: logged once until it reads again, and nothing else changes.

Where Prometheus scraped the exporter, the pod's own labels may be kept as
``exported_pod`` / ``exported_namespace`` (the scrape's ``honor_labels: false``): those win.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PROF = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
SOURCE = "dcgm"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodsOf:
    """A running workload and the pods of its current attempt (namespace, name)."""

    workload: str
    pods: tuple[tuple[str, str], ...]
    started_at: float


def parse(text: str) -> dict[tuple[str, str], list[float]]:
    """The busy fractions per (namespace, pod) in an exporter's page, one per GPU (or MIG
    instance): the engine-active ratio where the page has it for that pod, else the
    utilisation percent / 100. Raises ValueError for a page that is not Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    got: dict[str, dict[tuple[str, str], dict[tuple[str, str, str], float]]] = {PROF: {},
                                                                                 UTIL: {}}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in got:
                continue
            lab = s.labels
            pod = lab.get("exported_pod") or lab.get("pod")
            ns = lab.get("exported_namespace") or lab.get("namespace")
            if not pod or not ns:
                continue  # a GPU no pod holds
            v = float(s.value)
            if v != v:  # NaN: no reading
                continue
            frac = v if s.name == PROF else v / 100.0
            gpu = (lab.get("Hostname", ""), lab.get("UUID") or lab.get("gpu", ""),
                   lab.get("GPU_I_ID", ""))
            got[s.name].setdefault((ns, pod), {})[gpu] = min(1.0, max(0.0, frac))
    out: dict[tuple[str, str], list[float]] = {}
    for key in got[PROF].keys() | got[UTIL].keys():
        per_gpu = got[PROF].get(key) or got[UTIL][key]
        out[key] = list(per_gpu.values())
    return out


def _fetch(url: str, timeout: float) -> str:
    req = urllib.request.Request(url, headers={"Accept": "text/plain"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - an admin's URL
        return r.read(16 << 20).decode("utf-8", "replace")


class DcgmBusy:
    """Busy samples for running Kubernetes workloads from a DCGM exporter's page."""

    def __init__(self, url: str, timeout: float = 5.0, max_gap: float = 300.0,
                 fetch: Callable[[str, float], str] | None = None,
                 log: logging.Logger | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.max_gap = max_gap
        self._fetch = fetch or _fetch
        self.log = log or _LOG
        self.failing: str | None = None  # why the last read gave nothing (logged once)
        self._last: dict[str, float] = {}

    def read(self) -> dict[tuple[str, str], list[float]] | None:
        """The page's readings, or None (and logged once) where it cannot be read."""
        try:
            readings = parse(self._fetch(self.url, self.timeout))
        except Exception as e:  # noqa: BLE001 - any failure: unknown, never a crash
            why = f"{type(e).__name__}: {e}"[:300]
            if self.failing is None:
                self.log.warning("busy time from the DCGM exporter at %s is unknown: %s",
                                 self.url, why)
            self.failing = why
            return None
        if self.failing is not None:
            self.log.info("busy time from the DCGM exporter at %s is read again", self.url)
            self.failing = None
        return readings

    def tick(self, running: Iterable[PodsOf], now: float
             ) -> list[tuple[str, float, float, float, str]]:
        """One reading: samples ``(workload, start, end, fraction, "dcgm")`` from each
        workload's previous reading (or its start; at most ``max_gap`` back) to ``now``."""
        running = list(running)
        readings = self.read()
        if readings is None:  # up to now unknown: the next reading covers from here on
            self._last = {r.workload: now for r in running}
            return []
        out = []
        seen = set()
        for r in running:
            seen.add(r.workload)
            values: list[float] = []
            for key in r.pods:
                got = readings.get(key)
                if not got:
                    values = []
                    break
                values.extend(got)
            since = max(self._last.get(r.workload, r.started_at), r.started_at,
                        now - self.max_gap)
            if not values:
                self._last.pop(r.workload, None)
                continue
            self._last[r.workload] = now
            if now > since:
                out.append((r.workload, since, now, sum(values) / len(values), SOURCE))
        for w in set(self._last) - seen:
            del self._last[w]
        return out


def pods_of(pods: Iterable[dict], running: Iterable[tuple[str, float]]) -> list[PodsOf]:
    """The running workloads ``(workload, started_at)`` with their running pods (the
    backend's pod objects, whose annotation names their workload exactly); a workload with
    no running pod is left out (nothing to read)."""
    from .k8s_objects import A_WORKLOAD

    by_workload: dict[str, list[tuple[str, str]]] = {}
    for p in pods:
        md = p.get("metadata") or {}
        w = (md.get("annotations") or {}).get(A_WORKLOAD)
        if w and (p.get("status") or {}).get("phase") == "Running":
            by_workload.setdefault(w, []).append((md.get("namespace", ""), md.get("name", "")))
    return [PodsOf(w, tuple(sorted(by_workload[w])), started) for w, started in running
            if w in by_workload]
