"""p99 latency of GET /api/v1/workloads/me at a fixed request rate on loopback.

Starts a real JupyterHub (with configurable-http-proxy) and the gpubudget service (SQLite
ledger), gives the user some workloads, then sends requests open-loop at --rate requests/s
for --seconds (latency is measured from each request's scheduled send time, so a slow
server cannot hide queueing). With --contend it measures again with one CPU-bound competitor
process per core running (a machine loaded by other work). Prints the figures; the last line
is JSON {"p99_ms": ..., "p99_contended_ms": ...}.

With --replicas N (N >= 2) it starts a throwaway PostgreSQL (tests/fixtures/postgres.py) and N
service replicas on that one ledger (one leads, the others stand by; docs/service.md,
"Replicas"), and drives the same load the way the hub's and the lab's clients do with the
replica URL list: each client connection starts at its own replica (the reads spread over all)
and moves to the next on a connection failure or a 503; the setup's writes go to the leader
(a standby refuses them with not_leader and the client tries the next).

    python bench/api.py [--rate 200] [--seconds 15] [--db URL] [--contend] [--replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from tests.fixtures.hub import ServiceProc, free_port, http, start_hub  # noqa: E402

TARGET_P99_MS = 25.0
TARGET_P99_CONTENDED_MS = 100.0


def _burn() -> None:
    """A CPU-bound competitor: spins until killed."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def competitors(n: int) -> list[multiprocessing.Process]:
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, round(q / 100 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


class Conn:
    """A persistent HTTP/1.1 connection (keep-alive), as a browser or a client library uses."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, token: str) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                          f"Authorization: token {token}\r\n\r\n".encode())
        await self.writer.drain()
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            if k.lower() == "content-length":
                length = int(v)
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


async def load(urls: str | list[str], token: str, rate: float, seconds: float,
               connections: int = 32) -> tuple[list[float], int, list[int]]:
    """Open loop: request i is due at t0 + i/rate; latency counts from when it was due.
    ``urls``: one URL, or the replicas' (the same path on each): connection i starts at
    replica i mod n and moves to the next on a connection failure or a 503 (a retry's time
    counts in the request's latency). Returns the latencies (ms), the errors and how many
    requests each replica answered."""
    replicas = [urlparse(u) for u in ([urls] if isinstance(urls, str) else urls)]
    n = int(rate * seconds)
    lat: list[float] = []
    errors = 0
    answered = [0] * len(replicas)
    due: asyncio.Queue[float] = asyncio.Queue()
    t0 = time.perf_counter() + 0.2

    async def producer() -> None:
        for i in range(n):
            at = t0 + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            due.put_nowait(at)

    async def worker(k: int) -> None:
        nonlocal errors
        at_replica = k % len(replicas)

        def conn_to(i: int) -> Conn:
            u = replicas[i]
            return Conn(u.hostname or "127.0.0.1", u.port or 80)

        conn = conn_to(at_replica)
        while True:
            at = await due.get()
            for _try in range(len(replicas)):
                try:
                    status = await conn.get(replicas[at_replica].path, token)
                except (OSError, ValueError, asyncio.IncompleteReadError):
                    status = None
                if status == 200:
                    answered[at_replica] += 1
                    break
                if status is not None and status != 503:
                    break
                at_replica = (at_replica + 1) % len(replicas)  # the next replica
                conn = conn_to(at_replica)
            if status != 200:
                errors += 1
            lat.append((time.perf_counter() - at) * 1000)
            due.task_done()

    workers = [asyncio.create_task(worker(k)) for k in range(connections)]
    await producer()
    await due.join()
    for w in workers:
        w.cancel()
    return lat, errors, answered


class ReplicaProc(ServiceProc):
    """One more replica of the hub's gpubudget service on its own port (the same service
    identity and token: the hub authenticates its callers for either)."""

    def __init__(self, *a: object, port: int, **kw: object) -> None:
        super().__init__(*a, **kw)
        self.port = port
        self.extra_args = [*self.extra_args, f"--port={port}", "--ip=127.0.0.1",
                           f"--GpuBudgetService.replica_url={self.base}/"]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/gpubudget"

    def env(self) -> dict:
        env = super().env()
        env["JUPYTERHUB_SERVICE_URL"] = f"http://127.0.0.1:{self.port}"
        return env


def write(svcs: list[ServiceProc], method: str, path: str, token: str,
          body: object = None) -> tuple[int, object]:
    """A write through the replica list: a standby's 503 not_leader sends it to the next."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for svc in svcs:
            status, out = http(method, svc.api + path, token, body)
            if status != 503:
                return status, out
        time.sleep(0.2)
    raise RuntimeError(f"{method} {path}: no replica leads after 60 s (see the service logs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workloads", type=int, default=20, help="workloads the user has")
    ap.add_argument("--db", default=None, help="ledger URL (default: SQLite in a temp dir)")
    ap.add_argument("--contend", action="store_true",
                    help="measure again with one CPU-bound competitor process per core")
    ap.add_argument("--replicas", type=int, default=1,
                    help="service replicas on one PostgreSQL ledger (>= 2: starts a throwaway "
                         "PostgreSQL unless --db names one)")
    args = ap.parse_args()

    d = Path(tempfile.mkdtemp(prefix="gpubudget-bench-"))
    pg = None
    db = args.db
    if args.replicas > 1 and db is None:
        from tests.fixtures.postgres import start_postgres

        pg = start_postgres()
        db = pg.new_database()
    if args.replicas > 1 and not db.startswith(("postgres://", "postgresql")):
        sys.exit("bench/api.py: --replicas needs a PostgreSQL ledger: give --db "
                 "postgresql://... or no --db (a throwaway PostgreSQL is started)")
    hub = start_hub(d / "hub")
    common = dict(cycle_interval=1.0, extra_args=["--LocalBackend.allowed_commands=sleep .*"])
    svcs: list[ServiceProc] = [ServiceProc(hub, d / "svc", db or f"sqlite:///{d / 'ledger.sqlite'}",
                                           **common)]
    for _ in range(args.replicas - 1):  # the same jobs directory: replicas of one node
        svcs.append(ReplicaProc(hub, d / "svc", db, port=free_port(), **common))
    try:
        for svc in svcs:  # one at a time: the first leads
            svc.start()
        token = hub.token("bob")
        for i in range(args.workloads):
            status, _ = write(svcs, "POST", "/jobs", token,
                              {"command": "sleep 600", "project": "lattice", "gpus": 1,
                               "name": f"bench{i}"})
            assert status == 201
        urls = [svc.api + "/workloads/me" for svc in svcs]
        for url in urls:  # every replica answers (a standby once it has followed the ledger)
            deadline = time.monotonic() + 30
            while True:
                status, body = http("GET", url, token)
                if status == 200 and len(body["workloads"]) == args.workloads:
                    break
                assert time.monotonic() < deadline, (url, status, body)
                time.sleep(0.2)
        roles = [http("GET", svc.api + "/leader")[1].get("role") for svc in svcs]
        asyncio.run(load(urls, token, 20, 1))  # warm-up (token cache, connections)

        def measure(label: str, target: float) -> tuple[float, float, int, int]:
            lat, errors, answered = asyncio.run(load(urls, token, args.rate, args.seconds))
            lat.sort()
            p50, p90, p99 = (percentile(lat, q) for q in (50, 90, 99))
            print(f"{label}: GET /api/v1/workloads/me  rate={args.rate:g}/s  "
                  f"duration={args.seconds:g}s  requests={len(lat)}  errors={errors}  "
                  f"workloads/user={args.workloads}"
                  + (f"  replicas={len(svcs)} ({', '.join(roles)}) answered "
                     f"{'/'.join(map(str, answered))}" if len(svcs) > 1 else ""))
            print(f"  latency ms: p50={p50:.2f}  p90={p90:.2f}  p99={p99:.2f}  "
                  f"max={lat[-1]:.2f}   target p99 <= {target:g} ms: "
                  f"{'met' if p99 <= target else 'MISSED'}", flush=True)
            return p50, p99, len(lat), errors

        p50, p99, n, errors = measure("quiet", TARGET_P99_MS)
        out = {"p99_ms": round(p99, 3), "p50_ms": round(p50, 3), "rate": args.rate,
               "requests": n, "errors": errors, "replicas": len(svcs)}
        if args.contend:
            cores = os.cpu_count() or 1
            procs = competitors(cores)
            try:
                c50, c99, cn, cerr = measure(f"contended ({cores} CPU-bound competitors)",
                                             TARGET_P99_CONTENDED_MS)
            finally:
                for pr in procs:
                    pr.kill()
            out.update(p99_contended_ms=round(c99, 3), p50_contended_ms=round(c50, 3),
                       competitors=cores, errors_contended=cerr,
                       contended_vs_quiet_p99=round(c99 / p99, 2) if p99 else None)
        root = hub.token("root")
        for r in http("GET", svcs[0].api + "/queue", root)[1]["queue"]:
            write(svcs, "DELETE", f"/jobs/{r['id']}", root)
        for w in http("GET", urls[0], token)[1]["workloads"]:
            if w["state"] == "running":
                write(svcs, "DELETE", f"/jobs/{w['id']}", token)
        print(json.dumps(out))
    finally:
        for svc in reversed(svcs):
            svc.stop()
        hub.stop()
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.datadir.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
