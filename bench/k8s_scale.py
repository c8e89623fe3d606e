"""The Kubernetes backend at scale against a real control plane.

Starts the control plane of the tests (tests/fixtures/k8s.py: etcd, kube-apiserver,
kube-scheduler, kube-controller-manager built from Go modules; kwok plays the kubelets — no
kubelet, no container runs, no device plugin, no GPU), with hub_config/z2jh/rbac.yaml applied,
adds ``--nodes`` kwok nodes of 8 ``nvidia.com/gpu`` each (default 500), and submits
``--workloads`` one-GPU batch jobs (default 5,000: one pod each) through the service's own
scheduling loop (ledger on SQLite, the pure core deciding) with ``KubernetesBackend`` as the
service runs it (the service account's token, namespace jhub), as
tests/kubernetes/test_real_loop.py drives it. When the workloads outnumber the GPUs, every
pod ends (Succeeded) as soon as it runs, so the queue drains through the freed GPUs; otherwise
they run until the end of the bench.

Measured:
- decision → Running: from the start of the cycle whose core decided the Start (the loop's
  clock for it; the ledger keeps the launch moment as the start instead) to the moment this
  process's own watch of the pods (a separate stream, the admin's token) sees the workload's
  pod Running; also launch → Running, from the loop's call of ``backend.launch_many`` (the
  cluster's part), split into launch → pod made (job controller) → bound (scheduler) →
  Running (kwok).
- API calls per decision: a counting wrapper around kubernetes-asyncio's REST client in the
  service process (every request the backend makes: creates, reads, lists, watch openings),
  split by verb and resource; divided by the Starts applied.
- the service process's RSS (this process: the loop, the ledger, the backend's caches of
  Jobs, pods and nodes; the bench's own pod watch is small beside them) and peak RSS.
- cycle time: every ``loop.cycle()`` while work was pending.
- submit → Running (from each workload's submission, the queue's wait included) and when the
  last pod was seen Running (from the loop's first cycle). With ``--max-starts N`` (the
  policy's ``max_starts_per_cycle``; 32 here by default, one batch of creates per cycle; 0:
  no cap, the core's own default) each cycle decides at most N Starts and the loop cycles
  again at once: decision → Running shrinks because the decision itself comes later for the
  work behind the first N — the queue's wait is moved before the decision, not removed.
  Compare these two figures, not decision → Running alone, between runs with and without it.

The test cluster's knobs (not the product's) are set here as a cluster of this size is run:
kwok writes a pod's status with ``--kwok-parallelism`` workers (default 32; kwok's own default
is 4, which at 1,000 pods made kwok's bound → Running the largest part, ~8 s) and each node's
status every ``--heartbeat-s`` (default 300, a kubelet's ``nodeStatusReportFrequency`` when
it renews a node Lease, as kwok does every 10 s: the tests' 3 s for 500 nodes was ~170
status writes a second that the API server and etcd served instead of the pods);
kube-controller-manager and kube-scheduler get ``--api-qps`` (default 200) and 2x burst
(their stock 20/30 and 50/100 throttle a burst of a thousand pods). The tests' control plane
keeps kwok's and the controllers' stock settings and the 3 s heartbeat.

    python bench/k8s_scale.py [--nodes 500] [--workloads 5000] [--timeout 420] [--max-starts 32]

Needs the control-plane binaries ($GPUBUDGET_K8S or ``bash .ci/build-k8s.sh``) and the
kubernetes extra. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpubudget.backends import k8s_objects as ko  # noqa: E402
from jupyter_gpubudget.backends.kubernetes import KubernetesBackend  # noqa: E402
from tests.fixtures.k8s import (  # noqa: E402
    EXIT_ENV,
    NAMESPACE,
    FakeNode,
    find_bin_dir,
    start_control_plane,
)
from tests.kubernetes.conftest import apply_rbac  # noqa: E402
from tests.kubernetes.serviceloop import make_loop  # noqa: E402

BENCH_LABEL = "gpubudget.bench/scale"


def rss_mib() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            got[k] = int(v.split()[0]) / 1024
    return got["VmRSS"], got["VmHWM"]


class Calls:
    """Counts every request kubernetes-asyncio's REST client sends (the backend's API calls)."""

    def __init__(self) -> None:
        from kubernetes_asyncio.client import rest

        self.by: Counter[tuple[str, str]] = Counter()
        orig = rest.RESTClientObject.request
        calls = self

        async def request(self, method, url, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            path = urllib.parse.urlsplit(url).path
            q = kw.get("query_params") or (a[0] if a else None) or []
            watch = any(k == "watch" and v for k, v in (q.items() if isinstance(q, dict)
                                                         else q))
            res = path.rstrip("/").split("/")
            # /api/v1/namespaces/jhub/pods[/name] -> pods; /apis/batch/v1/.../jobs -> jobs
            kind = next((r for r in reversed(res) if r in (
                "pods", "jobs", "nodes", "selfsubjectaccessreviews",
                "resourceclaimtemplates")), path)
            verb = "WATCH" if watch else method
            calls.by[(verb, kind)] += 1
            return await orig(self, method, url, *a, **kw)

        rest.RESTClientObject.request = request

    def total(self) -> int:
        return sum(self.by.values())


class PodWatch(threading.Thread):
    """The bench's own watch of the job pods (admin token, raw HTTP stream): the first moment
    each workload's pod is seen Running (or already Succeeded)."""

    def __init__(self, cp, names: dict[str, str]) -> None:  # noqa: ANN001
        super().__init__(daemon=True, name="pod-watch")
        self.cp, self.names = cp, names
        self.created: dict[str, float] = {}  # the job controller made the pod
        self.bound: dict[str, float] = {}  # the scheduler bound it to a node
        self.running: dict[str, float] = {}
        self.stop = False

    def run(self) -> None:
        sel = urllib.parse.quote(f"{ko.MANAGED_BY[0]}={ko.MANAGED_BY[1]}")
        rv = ""
        while not self.stop:
            url = (f"{self.cp.url}/api/v1/namespaces/{NAMESPACE}/pods?watch=1&labelSelector={sel}"
                   f"&timeoutSeconds=60&allowWatchBookmarks=false"
                   + (f"&resourceVersion={rv}" if rv else ""))
            req = urllib.request.Request(url, headers={
                "Authorization": f"Bearer {self.cp.admin_token}"})
            try:
                with urllib.request.urlopen(req, context=self.cp.admin.ctx, timeout=90) as r:
                    for line in r:
                        ev = json.loads(line)
                        if ev.get("type") == "ERROR":
                            rv = ""
                            break
                        pod = ev["object"]
                        rv = pod["metadata"].get("resourceVersion") or rv
                        phase = (pod.get("status") or {}).get("phase")
                        wl = (pod["metadata"].get("labels") or {}).get(ko.L_WORKLOAD, "")
                        wid = self.names.get(wl)
                        if wid:
                            now = time.time()
                            self.created.setdefault(wid, now)
                            if (pod.get("spec") or {}).get("nodeName"):
                                self.bound.setdefault(wid, now)
                            if phase in ("Running", "Succeeded"):
                                self.running.setdefault(wid, now)
                        if self.stop:
                            return
            except (OSError, ValueError):
                time.sleep(0.2)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--timeout", type=float, default=420,
                    help="seconds the loop may take to start every workload (default 420: "
                         "with the control plane's start and 500 nodes the whole run stays "
                         "under 10 minutes; what never started is counted)")
    ap.add_argument("--api-qps", type=int, default=200,
                    help="client QPS (and 2x burst) of kube-controller-manager and "
                         "kube-scheduler, and 50 concurrent Job syncs, as a large cluster "
                         "is tuned (default 200; 0: their stock settings, as the tests run "
                         "them: 20/30 and 5 for the controllers, 50/100 for the scheduler)")
    ap.add_argument("--kwok-parallelism", type=int, default=32,
                    help="kwok's podPlayStageParallelism: pod status writes at once "
                         "(kwok's default and the tests': 4)")
    ap.add_argument("--heartbeat-s", type=float, default=300,
                    help="seconds between a node's status writes by kwok (the tests': 3; "
                         "kwok renews node Leases every 10 s either way)")
    ap.add_argument("--max-starts", type=int, default=32,
                    help="the policy's max_starts_per_cycle (default 32: one batch of "
                         "--launch-concurrency creates per cycle; 0: no cap, the cycle "
                         "decides every Start it can)")
    ap.add_argument("--launch-concurrency", type=int, default=32,
                    help="KubernetesBackend.launch_concurrency: Job creates in flight at once")
    args = ap.parse_args()
    if args.nodes < 1 or args.workloads < 1 or args.launch_concurrency < 1 \
            or args.kwok_parallelism < 1 or args.heartbeat_s <= 0 or args.max_starts < 0:
        ap.error("--nodes, --workloads, --launch-concurrency and --kwok-parallelism must be "
                 "at least 1, --heartbeat-s above 0, --max-starts at least 0")
    logging.basicConfig(level=logging.WARNING)

    bins, why = find_bin_dir()
    if bins is None:
        sys.exit(f"k8s_scale: needs {why}")
    tmp = Path(tempfile.mkdtemp(prefix="gpubudget-k8s-scale-"))
    t0 = time.monotonic()
    # kwok's heartbeats for hundreds of nodes lag on a loaded machine: the node lifecycle
    # controller would mark nodes NotReady (and the service drain them), which is not what is
    # measured here
    grace = ["--node-monitor-grace-period", "10m", "--node-startup-grace-period", "10m"]
    extra = {"kube-controller-manager": grace}
    if args.api_qps > 0:
        qps = ["--kube-api-qps", str(args.api_qps), "--kube-api-burst", str(2 * args.api_qps)]
        extra = {"kube-controller-manager": [*grace, *qps, "--concurrent-job-syncs", "50"],
                 "kube-scheduler": qps}
    cp = start_control_plane(bins, tmp / "cp", extra,
                             kwok_options={"podPlayStageParallelism": args.kwok_parallelism},
                             heartbeat_ms=int(args.heartbeat_s * 1000))
    backend = None
    watcher = None
    try:
        apply_rbac(cp)
        up_s = time.monotonic() - t0
        t = time.monotonic()
        names = [f"scale-{i:04d}" for i in range(args.nodes)]
        for n in names:
            m = FakeNode(n, 8).manifest()
            m["metadata"]["labels"][BENCH_LABEL] = "true"
            cp.admin.create("/api/v1/nodes", m)

        def ready() -> int:
            items = cp.admin.items("/api/v1/nodes", f"{BENCH_LABEL}=true")
            return sum(1 for o in items for c in o["status"].get("conditions") or []
                       if c["type"] == "Ready" and c["status"] == "True")
        while (r := ready()) < args.nodes:
            cp.check_alive()
            if time.monotonic() - t > 600:
                raise RuntimeError(f"only {r} of {args.nodes} nodes Ready after 600 s")
            time.sleep(1)
        nodes_s = time.monotonic() - t

        calls = Calls()
        backend = KubernetesBackend(
            log=logging.getLogger("bench.k8s"), kubeconfig=str(cp.service_kubeconfig),
            config_source="kubeconfig", namespace=NAMESPACE, stop_grace=2,
            request_timeout=30, watch_timeout=60, node_selector=f"{BENCH_LABEL}=true",
            launch_concurrency=args.launch_concurrency)
        ledger, loop = make_loop(tmp, backend)
        if args.max_starts:  # (one object: the loop reuses its read while the policy is the same)
            capped = replace(loop.policy_fn(), max_starts_per_cycle=args.max_starts)
            loop.policy_fn = lambda: capped
        gpus = loop.inventory.gpu_count
        assert gpus == 8 * args.nodes, (gpus, args.nodes)
        # more work than GPUs: every pod ends as it runs, the queue drains through the freed GPUs
        ends = args.workloads > gpus
        env = {EXIT_ENV: "0"} if ends else {}
        launched: dict[str, float] = {}
        # inside backend.launch_many: one batch of Starts (manifests + the concurrent POSTs)
        launch_ms: list[float] = []
        decided: dict[str, float] = {}  # the start of the cycle that decided the Start
        cycle_at = [0.0]
        orig_launch = backend.launch_many

        def launch_many(las):  # noqa: ANN001, ANN202
            at = time.time()
            for la in las:
                launched[la.workload] = at
                decided[la.workload] = cycle_at[0]
            try:
                return orig_launch(las)
            finally:
                launch_ms.append((time.time() - at) * 1000)
        backend.launch_many = launch_many  # type: ignore[method-assign]
        # the ledger's transactions of the Starts: one records a batch's Starts before its
        # Jobs are created, one records their launches after
        ledger_ms: list[float] = []

        def timed(fn):  # noqa: ANN001, ANN202
            def call(*a, **kw):  # noqa: ANN002, ANN003, ANN202
                at = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    ledger_ms.append((time.perf_counter() - at) * 1000)
            return call
        loop._start_many = timed(loop._start_many)  # type: ignore[method-assign]
        loop._launched = timed(loop._launched)  # type: ignore[method-assign]

        rss0, _ = rss_mib()
        wids = []
        submitted: dict[str, float] = {}
        t = time.monotonic()
        for i in range(args.workloads):
            wids.append(ledger.submit(
                project="lattice" if i % 2 else "scratch", user="alice" if i % 2 else "bob",
                kind="batch", now=time.time(), request={"kind": "gpu", "gpus": 1},
                command=["python", "-c", "pass"], env=env, backend="kubernetes",
                min_runtime=0.0, resumable=True).id)
            submitted[wids[-1]] = time.time()
        submit_s = time.monotonic() - t
        watcher = PodWatch(cp, {ko.label_value(w): w for w in wids})
        watcher.start()
        time.sleep(1)  # the watch is open before the first Start

        calls0 = calls.total()
        by0 = Counter(calls.by)
        cycles: list[float] = []
        starts_per_cycle: list[int] = []
        rss_max = 0.0
        t = time.monotonic()
        pending = set(wids)
        while pending:
            c = time.monotonic()
            cycle_at[0] = time.time()
            n_before = len(launched)
            loop.cycle()
            cycles.append((time.monotonic() - c) * 1000)
            starts_per_cycle.append(len(launched) - n_before)
            rss_max = max(rss_max, rss_mib()[0])
            pending -= set(launched)
            if time.monotonic() - t > args.timeout:
                print(f"timeout: {len(pending)} workloads never started", file=sys.stderr)
                break
            time.sleep(0.05)
        loop_s = time.monotonic() - t
        # the last pods still to be seen Running
        deadline = time.monotonic() + 60
        while len(watcher.running) < len(launched) and time.monotonic() < deadline:
            time.sleep(0.5)
        all_s = time.monotonic() - t
        calls_run = calls.total() - calls0
        by = Counter(calls.by)
        by.subtract(by0)
        rss_now, rss_peak = rss_mib()

        # submit -> Running: the queue's wait included (the loop's first cycle began after
        # the last submit); the moment the last pod was seen Running, from the loop's start
        s2r = [watcher.running[w] - submitted[w] for w in wids if w in watcher.running]
        loop_t0 = time.time() - (time.monotonic() - t)
        last_running_s = max(watcher.running.values(), default=float("nan")) - loop_t0
        starts, d2r, l2r, parts = 0, [], [], {k: [] for k in (
            "decided_to_launch", "launch_to_pod", "pod_to_bound", "bound_to_running")}
        for w in wids:
            if w not in launched:
                continue
            starts += 1
            if w in watcher.running:
                d2r.append(watcher.running[w] - decided[w])
                l2r.append(watcher.running[w] - launched[w])
                parts["decided_to_launch"].append(launched[w] - decided[w])
                cr = watcher.created.get(w, watcher.running[w])
                bd = watcher.bound.get(w, watcher.running[w])
                parts["launch_to_pod"].append(cr - launched[w])
                parts["pod_to_bound"].append(bd - cr)
                parts["bound_to_running"].append(watcher.running[w] - bd)
        never = starts - len(d2r)
    finally:
        if watcher is not None:
            watcher.stop = True
        if backend is not None:
            backend.close()
        cp.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # etcd's data and the logs

    per = calls_run / starts if starts else float("nan")
    print(f"control plane up {up_s:.1f} s; {args.nodes} nodes x 8 GPUs Ready in {nodes_s:.1f} s; "
          f"{args.workloads} workloads submitted in {submit_s:.1f} s "
          f"({'each pod ends as it runs' if ends else 'pods run until the end'})")
    print(f"loop: {len(cycles)} cycles, {starts} Starts in {loop_s:.1f} s "
          f"({starts / loop_s:.1f} Starts/s); all seen Running after {all_s:.1f} s; "
          f"{never} Starts never seen Running")
    print(f"decision -> Running: p50 {pct(d2r, .5):.2f} s, p95 {pct(d2r, .95):.2f} s, "
          f"max {max(d2r, default=float('nan')):.2f} s  (goal p50 <= 2 s)")
    print(f"launch   -> Running: p50 {pct(l2r, .5):.2f} s, p95 {pct(l2r, .95):.2f} s")
    print(f"submit   -> Running: p50 {pct(s2r, .5):.2f} s, p95 {pct(s2r, .95):.2f} s; the "
          f"last pod Running {last_running_s:.1f} s after the loop began")
    per_start = [c / n for c, n in zip(cycles, starts_per_cycle, strict=True) if n]
    first = min((launched[w] - decided[w] for w in launched), default=float("nan"))
    print(f"  the loop takes the cycle's Starts {args.launch_concurrency} at a time: one "
          f"ledger transaction records them, their Jobs are created together, one records "
          f"the launches: {pct(per_start, .5):.0f} ms per Start (p50 over cycles); one "
          f"backend.launch_many (manifests + concurrent POSTs) {pct(launch_ms, .5):.0f} ms "
          f"p50, {sum(launch_ms) / max(starts, 1):.1f} ms per Start; the ledger's "
          f"transactions {sum(ledger_ms) / max(starts, 1):.1f} ms per Start; the first "
          f"create {first:.2f} s after the cycle began (reap, state read, the core)")
    for k, xs in parts.items():
        print(f"  {k:18s} p50 {pct(xs, .5):6.2f} s  p90 {pct(xs, .9):6.2f} s")
    print(f"API calls: {calls_run} while the loop ran = {per:.2f} per Start (goal <= 3); "
          + ", ".join(f"{v} {k}: {n}" for (v, k), n in sorted(by.items()) if n))
    print(f"cycle: p50 {statistics.median(cycles):.0f} ms, p90 {pct(cycles, .9):.0f} ms, "
          f"max {max(cycles):.0f} ms")
    print(f"service RSS: {rss0:.0f} MiB before the loop, {rss_max:.0f} MiB max during it, "
          f"{rss_now:.0f} MiB at the end (peak {rss_peak:.0f} MiB)")
    print(json.dumps({
        "nodes": args.nodes, "workloads": args.workloads, "gpus": gpus, "starts": starts,
        "pods_end_when_running": ends,
        "decision_to_running_s_p50": round(pct(d2r, .5), 3),
        "decision_to_running_s_p90": round(pct(d2r, .9), 3),
        "decision_to_running_s_p95": round(pct(d2r, .95), 3),
        "launch_to_running_s_p50": round(pct(l2r, .5), 3),
        "submit_to_running_s_p50": round(pct(s2r, .5), 3),
        "last_running_after_loop_start_s": round(last_running_s, 1),
        "kwok_parallelism": args.kwok_parallelism, "heartbeat_s": args.heartbeat_s,
        **{f"{k}_s_p50": round(pct(xs, .5), 3) for k, xs in parts.items()},
        "api_qps": args.api_qps, "max_starts_per_cycle": args.max_starts,
        "launch_concurrency": args.launch_concurrency,
        "launch_many_call_ms_p50": round(pct(launch_ms, .5), 1),
        "launch_ms_per_start": round(sum(launch_ms) / max(starts, 1), 1),
        "ledger_ms_per_start": round(sum(ledger_ms) / max(starts, 1), 1),
        "cycle_to_first_launch_s": round(first, 3),
        "loop_ms_per_start_p50": round(pct(per_start, .5), 1),
        "api_calls_per_decision": round(per, 3),
        "api_calls": {f"{v} {k}": n for (v, k), n in sorted(by.items()) if n},
        "service_rss_mib": round(rss_max, 1), "service_rss_peak_mib": round(rss_peak, 1),
        "cycle_ms_p50": round(statistics.median(cycles), 1),
        "cycle_ms_p90": round(pct(cycles, .9), 1),
        "loop_s": round(loop_s, 1), "never_seen_running": never}))


if __name__ == "__main__":
    main()
