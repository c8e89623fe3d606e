"""Failover time of the gpubudget service's replicas on one real PostgreSQL ledger.

Starts PostgreSQL and --replicas service processes (tests/fixtures/replicas.py: each reaches
the database through its own loopback proxy), then --kills times: SIGKILLs the leader, and
measures from the kill until a scheduling cycle succeeded on the replica that took over;
the killed one is restarted as a standby. Prints each failover, then p50 / p95 / max; the
last line is JSON {"failover_p50_s": ..., "failover_max_s": ..., "kills": n}.

    python bench/failover.py [--kills 20] [--replicas 2] [--lease 8]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.hub import http  # noqa: E402
from tests.fixtures.postgres import start_postgres  # noqa: E402
from tests.fixtures.replicas import Cluster  # noqa: E402


def resumed(cluster: Cluster, old, t0: float) -> float:  # noqa: ANN001
    while True:
        for r in cluster.replicas:
            if r is old or r.role() != "leader":
                continue
            status, body = http("GET", r.api + "/healthz", timeout=5)
            at = body.get("last_ok_cycle_at") if isinstance(body, dict) else None
            if at is not None and at > t0:
                return at - t0
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--lease", type=float, default=8.0, help="lease_seconds")
    args = ap.parse_args()
    pg = start_postgres()
    url = pg.new_database()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="gpubudget-failover-")), pg.port,
                      url.rsplit("/", 1)[1], n=args.replicas, lease_seconds=args.lease)
    times: list[float] = []
    try:
        cluster.start()
        for i in range(args.kills):
            leader = cluster.wait_leader()
            cluster.call("POST", "/jobs", "bob", {"command": "sleep 1", "project": "lattice",
                                                  "gpus": 1}, key=f"bench{i}")
            t0 = time.time()
            leader.kill9()
            took = resumed(cluster, leader, t0)
            times.append(took)
            print(f"kill {i + 1}: {leader.name} -> scheduling resumed after {took:.2f} s",
                  flush=True)
            leader.start()
    finally:
        cluster.stop()
        pg.stop()
        shutil.rmtree(pg.datadir.parent, ignore_errors=True)
        shutil.rmtree(cluster.dir, ignore_errors=True)
    times.sort()
    p50 = times[len(times) // 2]
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(f"failover over {len(times)} kills (lease {args.lease:g} s): p50 {p50:.2f} s, "
          f"p95 {p95:.2f} s, max {times[-1]:.2f} s")
    print(json.dumps({"failover_p50_s": round(p50, 3), "failover_p95_s": round(p95, 3),
                      "failover_max_s": round(times[-1], 3), "kills": len(times),
                      "lease_s": args.lease, "replicas": args.replicas}))


if __name__ == "__main__":
    main()
