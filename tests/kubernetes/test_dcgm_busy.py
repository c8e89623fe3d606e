"""Busy time of Kubernetes workloads from the DCGM exporter's page (backends/k8s_busy.py).

The real exporter needs an NVIDIA GPU and its driver (none here): a local HTTP server serves a
page in the exporter's format (HELP/TYPE lines, the labels dcgm-exporter 3.x/4.x writes),
naming the pods the real control plane runs (tests/fixtures/k8s.py: kwok plays the kubelets).
The samples go to the ledger as NVML's do (``Ledger.record_busy``)."""

from __future__ import annotations

import http.server
import logging
import threading
import time

import pytest

from jupyter_gpubudget.backends import k8s_objects as ko
from jupyter_gpubudget.backends.k8s_busy import DcgmBusy, PodsOf, parse
from tests.fixtures.k8s import NAMESPACE, wait_for
from tests.kubernetes.test_real_rbac import job, whole

HEAD = """# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.
# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge
"""


def line(metric: str, value: float, gpu: int, pod: str = "", ns: str = NAMESPACE,
         host: str = "gpu-b", exported: bool = False) -> str:
    labels = {"gpu": str(gpu), "UUID": f"GPU-{host}-{gpu}", "device": f"nvidia{gpu}",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": host,
              "DCGM_FI_DRIVER_VERSION": "550.54.15"}
    if pod:
        pre = "exported_" if exported else ""
        labels.update({"container": "main", f"{pre}namespace": ns, f"{pre}pod": pod})
        if exported:  # the scrape's own labels: the exporter's pod
            labels.update({"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-x"})
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{metric}{{{body}}} {value}\n"


class Page:
    """A local HTTP server answering every GET with ``text`` (a test changes it)."""

    def __init__(self) -> None:
        self.text = HEAD
        self.status = 200
        page = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                data = page.text.encode()
                self.send_response(page.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a) -> None:  # noqa: ANN002
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def page():  # noqa: ANN201
    p = Page()
    yield p
    p.close()


def test_the_engine_ratio_wins_over_utilisation_and_exported_labels_over_the_scrapes():
    text = HEAD + "".join([
        line("DCGM_FI_DEV_GPU_UTIL", 100, 0, "a"), line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.25, 0, "a"),
        line("DCGM_FI_DEV_GPU_UTIL", 40, 1, "b"),  # no profiling metric: utilisation / 100
        line("DCGM_FI_DEV_GPU_UTIL", 70, 2, "c", exported=True),
        line("DCGM_FI_DEV_GPU_UTIL", 90, 3)])  # a GPU no pod holds
    assert parse(text) == {(NAMESPACE, "a"): [0.25], (NAMESPACE, "b"): [0.4],
                           (NAMESPACE, "c"): [0.7]}


def test_an_unreadable_page_is_unknown_logged_once_and_reads_again(page, caplog):
    d = DcgmBusy(page.url, timeout=5, log=logging.getLogger("test.dcgm"))
    run = [PodsOf("w1", ((NAMESPACE, "p1"),), 100.0)]
    page.text = HEAD + line("DCGM_FI_DEV_GPU_UTIL", 50, 0, "p1")
    assert d.tick(run, 130.0) == [("w1", 100.0, 130.0, 0.5, "dcgm")]
    with caplog.at_level(logging.INFO, logger="test.dcgm"):
        page.text = "<html>this is not Prometheus text {{"
        assert d.tick(run, 160.0) == [] and d.tick(run, 190.0) == []
        page.status = 500
        assert d.tick(run, 200.0) == []
        d.url = "http://127.0.0.1:9/metrics"  # nothing listens
        assert d.tick(run, 210.0) == []
        unknown = [r for r in caplog.records if "is unknown" in r.getMessage()]
        assert len(unknown) == 1, [r.getMessage() for r in caplog.records]
        d.url, page.status = page.url, 200
        page.text = HEAD + line("DCGM_FI_DEV_GPU_UTIL", 20, 0, "p1")
        # the time it could not read stays unknown: the next reading covers from the last try
        assert d.tick(run, 240.0) == [("w1", 210.0, 240.0, pytest.approx(0.2), "dcgm")]
        assert d.tick(run, 270.0) == [("w1", 240.0, 270.0, pytest.approx(0.2), "dcgm")]
    assert any("read again" in r.getMessage() for r in caplog.records)


def test_a_running_jobs_pods_get_busy_samples_recorded_in_the_ledger(k8s, real_backend, page,
                                                                     tmp_path):
    """A two-GPU job on the real control plane: the page names its pod's two GPUs (90 % and
    70 % engine-active); the backend's busy_now() samples it at 0.8 and the ledger's busy
    figures take them as NVML's. A workload whose pod the page does not name stays unknown."""
    from jupyter_gpubudget.core.accounts import load_budgets
    from jupyter_gpubudget.ledger import Ledger, connect, upgrade
    from jupyter_gpubudget.ledger.models import BusyChargeRow

    b = real_backend(dcgm_metrics_url=page.url)
    b.discover_inventory()
    wid = "dcgm00000000001"
    b.launch(job(wid, whole("gpu-b", 2, 3)))
    try:
        (pod,) = wait_for(lambda: [p for p in b.pods.items.values()
                                   if (p["metadata"].get("annotations") or {}).get(ko.A_WORKLOAD)
                                   == wid and p["status"].get("phase") == "Running"],
                          "the job's pod running in the backend's cache", 60)
        name = pod["metadata"]["name"]
        page.text = HEAD + "".join([
            line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9, 2, name),
            line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.7, 3, name),
            line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.1, 4, "someone-elses")])
        now = time.time()
        got = b.busy_now([(wid, now - 60), ("notrunning00001", now - 60)], now)
        assert got == [(wid, now - 60, now, pytest.approx(0.8), "dcgm")]
        # the pod gone from the page: unknown, not 0
        page.text = HEAD + line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.1, 4, "someone-elses")
        assert b.busy_now([(wid, now - 60)], now + 30) == []

        url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
        upgrade(url)
        led = Ledger(connect(url))
        led.sync_budgets(load_budgets("accounts:\n  p: {grant: 10, members: [u]}\n"), now=1.0)
        w = led.submit(project="p", user="u", kind="batch", request={"gpus": 2}, now=now - 120)
        led.start(w.id, placement=[], milli=2000, backed=True, protected_until=None,
                  now=now - 120)
        assert led.record_busy([(w.id, now - 60, now, 0.8, "dcgm")]) == 1
        with led.ro() as s:
            rows = s.query(BusyChargeRow).all()
        assert [(r.workload, r.busy_ms, r.measured_ms) for r in rows] == [
            (w.id, pytest.approx(0.8 * 2000 * 60), pytest.approx(2000 * 60))], rows
    finally:
        b.stop(wid, 1)
