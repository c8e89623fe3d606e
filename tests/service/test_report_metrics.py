"""The Prometheus counters of charged, measured and busy GPU-seconds per project
(``service/metrics.py``, ``GpuSecondsTotals``) rise by exactly what a job was charged and what
the busy sampler measured: the real ledger, the real scheduling loop and local backend running
real jobs, the busy sampler reading the NVML fake (no GPU here; the fake answers device
utilisation as NVML does), and the real prometheus_client exposition format. The service
object is a holder of the ledger only: the counters read nothing else."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from jupyter_gpubudget.inventory.busy import BusySampler
from jupyter_gpubudget.service.metrics import GpuSecondsTotals
from tests.inventory.fake_nvml import FakeNvml, hgx_h200

from .test_reports_busy import figures, ledger, run_two_jobs  # noqa: F401 - the fixture


class _Totals(Collector):
    def __init__(self, totals: GpuSecondsTotals) -> None:
        self.totals = totals

    def collect(self):  # noqa: ANN201
        yield from self.totals.families(["optics", "vision"])


def scrape(reg: CollectorRegistry) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            if s.name.endswith("_total"):
                out[(s.name, s.labels["project"])] = s.value
    return out


def test_counters_rise_by_the_charged_and_busy_seconds_of_a_job(ledger, tmp_path):  # noqa: F811
    totals = GpuSecondsTotals(SimpleNamespace(ledger=ledger))
    reg = CollectorRegistry()
    reg.register(_Totals(totals))
    before = scrape(reg)
    assert before[("gpubudget_charged_gpu_seconds_total", "optics")] == 0  # a series at 0
    nv = FakeNvml(hgx_h200(mig_gpus=())[:2])
    t0, end = run_two_jobs(ledger, tmp_path, BusySampler(nv, node="gpu-host"),
                           {"ann": 90, "ben": 10})
    totals.read()
    after = scrape(reg)
    rise = {k: after[k] - before[k] for k in after}
    _, job = figures(ledger, t0, end)  # the usage report of the jobs' hour
    for project, frac in (("optics", 0.9), ("vision", 0.1)):
        # one job of one GPU for about an hour: its charged seconds, busy as sampled
        charged = job[project]["charged_gpu_h"] * 3600
        assert charged == pytest.approx(3600, rel=0.01)
        assert rise[("gpubudget_charged_gpu_seconds_total", project)] == pytest.approx(
            charged, rel=1e-9)
        assert rise[("gpubudget_measured_gpu_seconds_total", project)] == pytest.approx(
            job[project]["measured_gpu_h"] * 3600, rel=1e-9)
        assert rise[("gpubudget_busy_gpu_seconds_total", project)] == pytest.approx(
            job[project]["busy_gpu_h"] * 3600, rel=1e-9)
        assert job[project]["busy_gpu_h"] == pytest.approx(frac, rel=0.02)


def test_a_scrape_reads_when_the_ledger_changed(ledger, tmp_path):  # noqa: F811
    """Outside an event loop a scrape reads at once; a second scrape with nothing new
    answers the same figures (a counter never falls)."""
    totals = GpuSecondsTotals(SimpleNamespace(ledger=ledger))
    reg = CollectorRegistry()
    reg.register(_Totals(totals))
    assert scrape(reg)[("gpubudget_charged_gpu_seconds_total", "optics")] == 0
    run_two_jobs(ledger, tmp_path, BusySampler(FakeNvml(None), node="gpu-host"), {})
    first = scrape(reg)
    assert first[("gpubudget_charged_gpu_seconds_total", "vision")] == pytest.approx(
        3600, rel=0.01)
    # nothing measured: busy stays 0 seconds counted, and measured says none was watched
    assert first[("gpubudget_measured_gpu_seconds_total", "vision")] == 0
    assert scrape(reg) == first
