"""The Grafana dashboard (hub_config/grafana/gpubudget.json) against a real Prometheus (Debian's
``prometheus`` package; ``make test`` installs it) scraping the real service with a token:

- the JSON is an importable dashboard with a datasource variable, every panel uses it;
- ``promtool check metrics`` accepts the service's ``/metrics``;
- every PromQL expression names only metrics ``/metrics`` really exports;
- Prometheus scrapes the service, and every dashboard query returns data (finite values)
  while a workload runs: jobs starting and ending, a session reporting GPU utilisation, a node
  drained (a preemption, drained GPUs).

With CI=true a missing Prometheus fails the test (outside CI it skips)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from tests.fixtures.hub import ServiceProc, free_port, http
from tests.hub.hubproc import require

from .conftest import cleanup

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "hub_config" / "grafana" / "gpubudget.json"
INVENTORY = """\
nodes:
  - {name: n1, model: H100-80GB, gpus: 2}
  - {name: n2, model: H100-80GB, gpus: 2}
"""
#: Grafana's own variables, as Grafana would fill them in for a short dashboard range
GRAFANA_VARS = {"$__rate_interval": "30s", "$__range": "2m", "$account": ".*"}
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "time", "le", "without",
                "avg", "max", "min", "count", "on", "ignoring", "offset", "bool", "and", "or",
                "unless", "label_values"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(d: dict) -> list[tuple[str, str]]:
    out = []
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    return out


def substitute(expr: str) -> str:
    for k, v in GRAFANA_VARS.items():
        expr = expr.replace(k, v)
    assert "$" not in expr, expr
    return expr


def metric_names(expr: str) -> set[str]:
    """Identifiers used as metric names: not functions (followed by '('), not label names
    (inside {...} or by/without (...)), not keywords or numbers."""
    e = re.sub(r'"[^"]*"', '""', expr)  # label values
    e = re.sub(r"\{[^}]*\}", "{}", e)  # label matchers
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)  # grouping labels
    e = re.sub(r"\[[^\]]*\]", "[]", e)  # ranges
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(0), e[m.end():].lstrip()
        if word in PROMQL_WORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def test_dashboard_is_importable_with_a_datasource_variable():
    d = dashboard()
    assert d["title"] and d["uid"] == "gpubudget" and d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"].strip()
    # what the issue asks to be on it
    exprs = " ".join(e for _, e in expressions(d))
    for metric in ("gpubudget_grant_gpu_seconds", "gpubudget_usage_gpu_seconds",
                   "gpubudget_standing",
                   "gpubudget_workloads_running", "gpubudget_workloads_pending",
                   "gpubudget_wait_seconds_bucket", "gpubudget_preemptions_total",
                   "gpubudget_gpus", "gpubudget_idle_gpu_seconds_total",
                   "gpubudget_session_gpu_utilisation_percent", "gpubudget_cycle_seconds_bucket",
                   "gpubudget_preemption_lost_day_gpu_seconds",
                   "gpubudget_drain_loss_budget_gpu_seconds"):
        assert metric in exprs, metric


@pytest.fixture(scope="module")
def prom_bins():
    prom, promtool = shutil.which("prometheus"), shutil.which("promtool")
    require(prom is not None and promtool is not None,
            "Prometheus and promtool (apt-get install prometheus; make test does)")
    return prom, promtool


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("grafana")
    (d / "inventory.yaml").write_text(INVENTORY)
    s = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}", cycle_interval=0.5,
                    extra_args=["--LocalBackend.stop_grace=1"])
    s.start()
    yield s
    cleanup(s, tokens["root"])


@pytest.fixture(scope="module")
def prometheus(prom_bins, svc, tokens, tmp_path_factory):
    prom, _ = prom_bins
    d = tmp_path_factory.mktemp("prometheus")
    (d / "token").write_text(tokens["root"])
    (d / "token").chmod(0o600)
    port = free_port()
    target = svc.base.split("//", 1)[1].split("/", 1)[0]
    (d / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: gpubudget
    metrics_path: /services/gpubudget/metrics
    authorization: {{type: Bearer, credentials_file: {d / 'token'}}}
    static_configs: [{{targets: ['{target}']}}]
""")
    log = open(d / "prometheus.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([prom, f"--config.file={d / 'prometheus.yml'}",
                             f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=d)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (d / "prometheus.log").read_text()[-3000:]
        try:
            st, body = http("GET", url + "/api/v1/targets", timeout=2)
            ups = [t for t in body["data"]["activeTargets"] if t["health"] == "up"] \
                if st == 200 else []
            if ups:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, (d / "prometheus.log").read_text()[-3000:]
        time.sleep(0.3)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_promtool_accepts_the_metrics_and_the_dashboard_names_only_exported_ones(
        prom_bins, svc, tokens):
    from prometheus_client.parser import text_string_to_metric_families

    _, promtool = prom_bins
    st, text = http("GET", svc.base + "/metrics", tokens["root"])
    assert st == 200 and isinstance(text, str)
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60, check=False)
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr
    # every series /metrics declares (a family may have no sample yet, e.g. nothing running)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    exported = set()
    for fam in text_string_to_metric_families(text):
        exported |= {s.name for s in fam.samples}
        exported |= {fam.name + x for x in suffixes.get(fam.type, ("",))}
    for title, expr in expressions(dashboard()):
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= exported, (title, names - exported)
    # the check can fail: a made-up metric is caught
    assert metric_names('sum by (kind) (rate(gpubudget_made_up_total{a="b"}[5m]))') == {
        "gpubudget_made_up_total"}


def query(prom: str, expr: str, at: float | None = None) -> list:
    """An instant query, now or at ``at`` (Unix time)."""
    args = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    st, body = http("GET", prom + "/api/v1/query?" + urllib.parse.urlencode(args))
    assert st == 200 and body["status"] == "success", (expr, body)
    return body["data"]["result"]


def test_every_dashboard_query_returns_data_while_a_workload_runs(prometheus, svc, tokens):
    root, bob = tokens["root"], tokens["bob"]
    stop = threading.Event()
    st, sess = http("POST", svc.api + "/sessions", root,
                    {"user": "dave", "project": "astro", "gpus": 1, "min_runtime": "1h"})
    assert st == 201, sess
    sid = sess["id"]
    for bad in ({"gpu_utilisation": 150}, {"gpu_utilisation": "busy"}, {"gpu_utilisation": True}):
        st, out = http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root, bad)
        assert st == 400 and out["field"] == "gpu_utilisation", out
    st, long = http("POST", svc.api + "/jobs", bob,
                    {"command": "sleep 120", "project": "lattice", "gpus": 1,
                     "resumable": True, "name": "long"})
    assert st == 201
    st, wide = http("POST", svc.api + "/jobs", bob,
                    {"command": "sleep 60", "project": "lattice", "gpus": 4, "name": "waits"})
    assert st == 201  # all four GPUs: it waits (one is the session's)

    def workload() -> None:
        """Short jobs keep starting (waits observed), the session reports its utilisation."""
        i = 0
        while not stop.is_set():
            http("POST", svc.api + "/jobs", bob, {"command": "sleep 1", "project": "lattice",
                                                  "gpus": 0, "name": f"short-{i}"})
            http("POST", f"{svc.api}/sessions/{sid}/heartbeat", root,
                 {"gpu_utilisation": 37.5 + i % 5})
            i += 1
            stop.wait(1.0)

    t = threading.Thread(target=workload, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while http("GET", f"{svc.api}/workloads/{long['id']}", bob)[1]["state"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(3)  # a few scrapes before the drain
        node = http("GET", f"{svc.api}/workloads/{long['id']}", bob)[1]["placement"][0]["node"]
        st, out = http("PUT", f"{svc.api}/nodes/{node}/health", root,
                       {"healthy": False, "reason": "dashboard test"})
        assert st == 200, out
        missing = {}
        for title, expr in expressions(dashboard()):
            q = substitute(expr)
            deadline = time.monotonic() + 40
            while True:
                result = query(prometheus, q)
                values = [float(r["value"][1]) for r in result]
                if any(math.isfinite(v) for v in values):
                    break
                if time.monotonic() > deadline:
                    missing[title] = (q, result)
                    break
                time.sleep(1)
        assert not missing, missing
        # and the figures are the service's: the session's utilisation, the drain's
        # preemption and drained GPUs (once Prometheus has scraped them)
        def soon(expr: str, ok) -> list:  # noqa: ANN001
            deadline = time.monotonic() + 30
            while True:
                r = query(prometheus, expr)
                if r and ok(r):
                    return r
                assert time.monotonic() < deadline, (expr, r)
                time.sleep(0.5)

        util = soon("gpubudget_session_gpu_utilisation_percent", lambda r: True)
        assert {r["metric"]["session"] for r in util} == {sid}
        assert 37.5 <= float(util[0]["value"][1]) <= 41.5
        assert util[0]["metric"]["user"] == "dave" and util[0]["metric"]["project"] == "astro"
        soon('gpubudget_gpus{state="drained"}', lambda r: float(r[0]["value"][1]) >= 1)
        soon('gpubudget_preemptions_total{project="lattice"}',
             lambda r: float(r[0]["value"][1]) >= 1)
        # the panel's rate, evaluated just after Prometheus first scraped the preemption (its
        # window may have passed by now, on a busy machine)
        samples = query(prometheus, 'gpubudget_preemptions_total{project="lattice"}[15m]')
        first = min(float(t) for t, v in samples[0]["values"] if float(v) >= 1)
        panel = substitute(next(e for t, e in expressions(dashboard())
                                if t.startswith("Preemptions per hour")))
        rates = [query(prometheus, panel, at=first + dt) for dt in (0.0, 1.0, 2.0, 5.0)]
        assert any(float(x["value"][1]) > 0 for r in rates for x in r), rates
        soon(f'gpubudget_node_state{{node="{node}",state="ready_for_repair"}}'
             f' or gpubudget_node_state{{node="{node}",state="draining"}}', lambda r: True)
    finally:
        stop.set()
        t.join(10)
        http("DELETE", f"{svc.api}/sessions/{sid}", root)
        http("PUT", f"{svc.api}/nodes/n1/health", root, {"healthy": True, "reason": "end"})
        http("PUT", f"{svc.api}/nodes/n2/health", root, {"healthy": True, "reason": "end"})
