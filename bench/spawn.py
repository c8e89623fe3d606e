"""Spawn-to-ready time: BudgetSpawner vs plain SimpleLocalProcessSpawner on an idle cluster.

Both hubs use the project's hub_config/jupyterhub_config.py (real JupyterHub, real
configurable-http-proxy, the gpubudget service managed by the hub); only the spawner differs.
The single-user "server" is the same minimal HTTP responder for both (``--serve`` mode of this
file), so the figure is the spawner's own overhead (queueing through the service, scheduling
cycle, placement -> environment), not JupyterLab's start-up time, which dominates otherwise.

    python bench/spawn.py [--runs 15]

Prints both medians and the ratio; the last line is JSON
{"budget_ms_p50": ..., "plain_ms_p50": ..., ...}. Target: overhead <= 150 ms (median).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGETS = """\
admins: [admin]
accounts:
  physics:
    grant: 100
    children:
      lattice: {grant: 100, members: [alice]}
"""
INVENTORY = "nodes:\n  - {name: bench, model: H100-80GB, gpus: 8}\n"

OVERRIDE = """
load_subconfig({demo!r})
c.Spawner.cmd = [{py!r}, {me!r}, "--serve"]
c.Spawner.args = []
c.Spawner.default_url = ""
c.Spawner.http_timeout = 30
c.JupyterHub.last_activity_interval = 3600
"""


def serve() -> None:
    """A minimal single-user server: answers every request on JUPYTERHUB_SERVICE_URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    u = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b'{"version": "bench"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    ThreadingHTTPServer((u.hostname or "127.0.0.1", u.port or 80), H).serve_forever()


def measure(kind: str, runs: int, base: Path) -> list[float]:
    from tests.hub.hubproc import http, start_demo_hub

    d = base / kind
    d.mkdir()
    (d / "budgets.yaml").write_text(BUDGETS)
    (d / "inventory.yaml").write_text(INVENTORY)
    cfg = d / "bench_config.py"
    text = OVERRIDE.format(demo=str(ROOT / "hub_config" / "jupyterhub_config.py"),
                           py=sys.executable, me=str(Path(__file__).resolve()))
    if kind == "plain":
        text += 'c.JupyterHub.spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"\n'
    cfg.write_text(text)
    import tests.hub.hubproc as hp

    saved = hp.CONFIG
    hp.CONFIG = cfg
    try:
        hub = start_demo_hub(d, d / "budgets.yaml", d / "inventory.yaml",
                             env={"GPUBUDGET_SLOW_SPAWN": "30", "GPUBUDGET_IDLE_LIMIT": "0",
                                  "GPUBUDGET_CYCLE_INTERVAL": "5"})
    finally:
        hp.CONFIG = saved
    opts = {"project": "lattice", "slice": "gpu:1", "min_runtime": "0"}
    times: list[float] = []
    try:
        for i in range(runs + 2):  # two warm-up spawns
            t0 = time.perf_counter()
            st, out = http("POST", f"{hub.api}/users/alice/server", hub.token,
                           opts if kind == "budget" else None)
            assert st in (201, 202), (st, out, hub.logtail())
            while True:
                st, u = http("GET", f"{hub.api}/users/alice", hub.token)
                srv = u["servers"].get("")  # type: ignore[index]
                if srv and srv.get("ready"):
                    break
                time.sleep(0.005)
            if i >= 2:
                times.append((time.perf_counter() - t0) * 1000)
            http("DELETE", f"{hub.api}/users/alice/server", hub.token)
            while http("GET", f"{hub.api}/users/alice", hub.token)[1]["servers"]:  # type: ignore[index]
                time.sleep(0.01)
    finally:
        hub.stop()
    return times


def main() -> None:
    if "--serve" in sys.argv:
        serve()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpubudget-bench-") as tmp:
        plain = measure("plain", a.runs, Path(tmp))
        budget = measure("budget", a.runs, Path(tmp))
    p50p, p50b = statistics.median(plain), statistics.median(budget)
    print(f"plain SimpleLocalProcessSpawner: spawn-to-ready p50 {p50p:.0f} ms "
          f"(min {min(plain):.0f}, max {max(plain):.0f}, n={len(plain)})")
    print(f"BudgetSpawner (queue + cycle + placement): p50 {p50b:.0f} ms "
          f"(min {min(budget):.0f}, max {max(budget):.0f}, n={len(budget)})")
    print(f"overhead p50 {p50b - p50p:.0f} ms (target <= 150 ms); ratio {p50b / p50p:.2f}x")
    print(json.dumps({"budget_ms_p50": round(p50b, 1), "plain_ms_p50": round(p50p, 1),
                      "overhead_ms_p50": round(p50b - p50p, 1),
                      "ratio": round(p50b / p50p, 3), "runs": a.runs}))


if __name__ == "__main__":
    main()
