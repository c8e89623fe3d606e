"""p99 latency of GET /api/v1/workloads/me at a fixed request rate on loopback.

Starts a real JupyterHub (with configurable-http-proxy) and the gpubudget service (SQLite
ledger), gives the user some workloads, then sends requests open-loop at --rate requests/s
for --seconds (latency is measured from each request's scheduled send time, so a slow
server cannot hide queueing). With --contend it measures again with one CPU-bound competitor
process per core running (a machine loaded by other work). Prints the figures; the last line
is JSON {"p99_ms": ..., "p99_contended_ms": ...}.

    python bench/api.py [--rate 200] [--seconds 15] [--db URL] [--contend]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from tests.fixtures.hub import ServiceProc, http, start_hub  # noqa: E402

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


async def load(url: str, token: str, rate: float, seconds: float,
               connections: int = 32) -> tuple[list[float], int]:
    """Open loop: request i is due at t0 + i/rate; latency counts from when it was due."""
    u = urlparse(url)
    n = int(rate * seconds)
    lat: list[float] = []
    errors = 0
    due: asyncio.Queue[float] = asyncio.Queue()
    t0 = time.perf_counter() + 0.2

    async def producer() -> None:
        for i in range(n):
            at = t0 + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            due.put_nowait(at)

    async def worker() -> None:
        nonlocal errors
        conn = Conn(u.hostname or "127.0.0.1", u.port or 80)
        while True:
            at = await due.get()
            try:
                if await conn.get(u.path, token) != 200:
                    errors += 1
            except (OSError, ValueError, asyncio.IncompleteReadError):
                errors += 1
                conn = Conn(u.hostname or "127.0.0.1", u.port or 80)
            lat.append((time.perf_counter() - at) * 1000)
            due.task_done()

    workers = [asyncio.create_task(worker()) for _ in range(connections)]
    await producer()
    await due.join()
    for w in workers:
        w.cancel()
    return lat, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--workloads", type=int, default=20, help="workloads the user has")
    ap.add_argument("--db", default=None, help="ledger URL (default: SQLite in a temp dir)")
    ap.add_argument("--contend", action="store_true",
                    help="measure again with one CPU-bound competitor process per core")
    args = ap.parse_args()

    d = Path(tempfile.mkdtemp(prefix="gpubudget-bench-"))
    hub = start_hub(d / "hub")
    svc = ServiceProc(hub, d / "svc", args.db or f"sqlite:///{d / 'ledger.sqlite'}",
                      cycle_interval=1.0,
                      extra_args=["--LocalBackend.allowed_commands=sleep .*"])
    try:
        svc.start()
        token = hub.token("bob")
        for i in range(args.workloads):
            status, _ = http("POST", svc.api + "/jobs", token,
                             {"command": "sleep 600", "project": "lattice", "gpus": 1,
                              "name": f"bench{i}"})
            assert status == 201
        url = svc.api + "/workloads/me"
        status, body = http("GET", url, token)
        assert status == 200 and len(body["workloads"]) == args.workloads
        asyncio.run(load(url, token, 20, 1))  # warm-up (token cache, connections)

        def measure(label: str, target: float) -> tuple[float, float, int, int]:
            lat, errors = asyncio.run(load(url, token, args.rate, args.seconds))
            lat.sort()
            p50, p90, p99 = (percentile(lat, q) for q in (50, 90, 99))
            print(f"{label}: GET /api/v1/workloads/me  rate={args.rate:g}/s  "
                  f"duration={args.seconds:g}s  requests={len(lat)}  errors={errors}  "
                  f"workloads/user={args.workloads}")
            print(f"  latency ms: p50={p50:.2f}  p90={p90:.2f}  p99={p99:.2f}  "
                  f"max={lat[-1]:.2f}   target p99 <= {target:g} ms: "
                  f"{'met' if p99 <= target else 'MISSED'}", flush=True)
            return p50, p99, len(lat), errors

        p50, p99, n, errors = measure("quiet", TARGET_P99_MS)
        out = {"p99_ms": round(p99, 3), "p50_ms": round(p50, 3), "rate": args.rate,
               "requests": n, "errors": errors}
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
        for r in http("GET", svc.api + "/queue", hub.token("root"))[1]["queue"]:
            http("DELETE", f"{svc.api}/jobs/{r['id']}", hub.token("root"))
        for w in http("GET", url, token)[1]["workloads"]:
            if w["state"] == "running":
                http("DELETE", f"{svc.api}/jobs/{w['id']}", token)
        print(json.dumps(out))
    finally:
        svc.stop()
        hub.stop()


if __name__ == "__main__":
    main()
