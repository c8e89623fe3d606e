"""Failover time of the gpubudget service's replicas on one real PostgreSQL ledger.

Starts PostgreSQL and --replicas service processes (tests/fixtures/replicas.py: each reaches
the database through its own loopback proxy), then --kills times: a fault hits the leader —
``kill`` (SIGKILL; the killed one is restarted as a standby) or ``pause`` (SIGSTOP, woken with
SIGCONT once another replica took over), taken in turn from --faults — and measures from the
fault until a scheduling cycle succeeded on the replica that took over. A job is submitted
before each fault, so faults land while jobs start and run.

``--backend local`` (default) runs the jobs with the local launcher; ``--backend slurm`` on
the real test Slurm cluster (tests/slurm/cluster.py: slurmctld, slurmdbd, two fake GPU
nodes), the replicas driving it with sbatch/squeue/sacct/scancel.

After the faults, once every job ended, the ledger is compared with the engine's own records:
``lost_charges`` — attempts the engine ran (the launcher's records, sacct) with no charge
interval at all; ``double_held_s`` — seconds during which a GPU was held by more charge
intervals than it has room for (the ledger's device claims); ``orphan_engine_jobs`` —
attempts the engine still runs with no open charge interval.

Prints each failover, then p50 / p95 / max; the last line is JSON {"failover_p50_s",
"failover_max_s", "lost_charges", "double_held_s", "orphan_engine_jobs", ...}.

    python bench/failover.py [--kills 20] [--replicas 2] [--lease 8] [--faults kill,pause]
                             [--backend local|slurm]
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
from tests.fixtures.replicas import INVENTORY, Cluster, Proxy, Replica  # noqa: E402

#: the Slurm runs: jobs of gpb-ben charged to astro (tests/slurm/conftest.py's budgets)
SLURM_TOKEN = "ben-token-0123456789abcdef"
SLURM_CONFIG = """\
c.GpuBudgetService.backend_class = "jupyter_gpubudget.backends.slurm.SlurmBackend"
c.SlurmBackend.user_command_prefix = ["sudo", "-n", "-u", "{user}",
                                      "--preserve-env=SLURM_CONF", "--"]
c.SlurmBackend.gpu_models = {"h100": "H100-80GB"}
c.SlurmBackend.watch_interval = 0.5
c.SlurmBackend.stop_grace = 20
c.SlurmBackend.usage_check_interval = 0
"""


class SlurmReplicas(Cluster):
    """Replicas whose backend is Slurm (the test cluster named by SLURM_CONF)."""

    def start(self) -> None:
        import json as _json

        from tests.slurm.conftest import BUDGETS

        (self.dir / "budgets.yaml").write_text(BUDGETS)
        (self.dir / "inventory.yaml").write_text(INVENTORY)
        (self.dir / "slurm_config.py").write_text(SLURM_CONFIG)
        tok = self.dir / "tokens.json"
        tok.write_text(_json.dumps({SLURM_TOKEN: {"name": "gpb-ben",
                                                  "scopes": ["custom:gpubudget:submit"]}}))
        tok.chmod(0o600)
        for i in range(self.n):
            proxy = Proxy(self.pg_port)
            url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{self.db_name}"
            r = Replica(chr(ord("a") + i), self.dir, url, proxy, lease_seconds=self.lease_seconds,
                        extra_args=[f"--config={self.dir / 'slurm_config.py'}"])
            self.replicas.append(r)
            r.start()


def slurm_up(base: Path):  # noqa: ANN201
    """The real test Slurm cluster with the suite's users and accounts (what tests/slurm's
    fixtures set up); SLURM_CONF names it for this process and the replicas."""
    import os
    import subprocess

    from tests.slurm.cluster import start_cluster
    from tests.slurm.conftest import BUDGETS, ensure_users

    ensure_users()
    cluster = start_cluster(base)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    (base / "budgets.yaml").write_text(BUDGETS)
    p = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.cli", "slurm", "sync-accounts",
                        f"--budgets={base / 'budgets.yaml'}"], capture_output=True, text=True,
                       env=cluster.env, timeout=120)
    if p.returncode != 0:
        cluster.stop()
        raise SystemExit(f"sync-accounts failed: {p.stdout}{p.stderr}")
    return cluster


def submit(cluster: Cluster, backend: str, i: int) -> None:
    body = {"command": "sleep 2", "gpus": 1, "resumable": i % 2 == 0, "name": f"bench{i}"}
    if backend == "slurm":
        headers = {"Idempotency-Key": f"bench{i}"}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # (the leader; a standby answers 503)
            for r in cluster.replicas:
                if r.alive and not r.paused:
                    status, _ = http("POST", r.api + "/jobs", SLURM_TOKEN,
                                     {**body, "project": "astro"}, headers=headers, timeout=10)
                    if status == 201 or status == 200:
                        return
            time.sleep(0.05)
        raise SystemExit("no replica took the job")
    cluster.call("POST", "/jobs", "bob", {**body, "project": "lattice"}, key=f"bench{i}")


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


def settle(db: str, timeout: float = 120.0) -> None:
    """Wait until no job is pending or running (each ran to its end)."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(db, autocommit=True) as c:
        while time.monotonic() < deadline:
            n = c.execute("SELECT count(*) FROM workloads WHERE state IN "
                          "('pending', 'running')").fetchone()[0]
            if not n:
                return
            time.sleep(0.5)
    print(f"warning: {n} jobs still pending or running after {timeout:g} s", flush=True)


def engine_attempts(backend: str, jobs_dir: Path) -> tuple[set, set]:
    """(attempts the engine ran, attempts it still runs) as (workload, attempt) pairs."""
    if backend == "slurm":
        import os
        import subprocess

        from jupyter_gpubudget.backends.slurm_map import ALIVE, parse_job_name

        env = dict(os.environ, SLURM_TIME_FORMAT="%s")
        out = subprocess.run(["sacct", "-X", "-n", "-P", "--format=JobName,State,Start",
                              "--starttime=now-1day", "--endtime=now"], capture_output=True,
                             text=True, env=env, timeout=60).stdout
        ran, alive = set(), set()
        for line in out.splitlines():
            name, _, rest = line.partition("|")
            state, _, started = rest.partition("|")
            key = parse_job_name("gpubudget", name)
            if key is None or key[1] is None:
                continue
            if started.strip().isdigit():
                ran.add(key)
            if (state.split() or [""])[0] in ALIVE:
                alive.add(key)
        return ran, alive
    from jupyter_gpubudget.backends.local import LocalBackend

    local = LocalBackend(state_dir=str(jobs_dir))
    ran = {(w.name, int(a.name)) for w in jobs_dir.iterdir() if w.is_dir()
           for a in w.iterdir() if a.name.isdigit() and (a / "pid").exists()} \
        if jobs_dir.is_dir() else set()
    return ran, set(local.orphans(set()))


def double_held_seconds(rows: list[tuple]) -> float:
    """Seconds during which one GPU was held beyond its room (1000 thousandths) by the
    ledger's device claims (node, gpu, milli, start, end)."""
    now = time.time()
    by: dict[tuple, list[tuple[float, int]]] = {}
    for node, gpu, milli, start, end in rows:
        ev = by.setdefault((node, gpu), [])
        ev += [(start, milli), (end if end is not None else now, -milli)]
    total = 0.0
    for ev in by.values():
        ev.sort(key=lambda e: (e[0], e[1]))  # (an end before a start at the same time)
        held, last = 0, None
        for t, d in ev:
            if last is not None and held > 1000:
                total += t - last
            held += d
            last = t
    return total


def audit(db: str, backend: str, jobs_dir: Path) -> dict:
    import psycopg

    with psycopg.connect(db, autocommit=True) as c:
        charged = {(w, s) for w, s in c.execute("SELECT workload, seq FROM charge_intervals")}
        open_iv = {(w, s) for w, s in c.execute(
            'SELECT workload, seq FROM charge_intervals WHERE "end" IS NULL')}
        try:
            claims = c.execute('SELECT node, gpu, milli, start, "end" FROM device_claims'
                               ).fetchall()
        except psycopg.Error:
            claims = None
    ran, alive = engine_attempts(backend, jobs_dir)
    return {"lost_charges": len(ran - charged),
            "double_held_s": None if claims is None else round(double_held_seconds(claims), 3),
            "orphan_engine_jobs": len(alive - open_iv), "engine_attempts": len(ran)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="how many faults")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--lease", type=float, default=8.0, help="lease_seconds")
    ap.add_argument("--faults", default="kill", help="faults taken in turn: kill, pause")
    ap.add_argument("--backend", choices=("local", "slurm"), default="local")
    args = ap.parse_args()
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if not faults or any(f not in ("kill", "pause") for f in faults):
        ap.error("--faults: a comma-separated list of kill, pause")
    pg = start_postgres()
    url = pg.new_database()
    base = Path(tempfile.mkdtemp(prefix="gpubudget-failover-"))
    base.chmod(0o755)
    if args.backend == "slurm":
        (base / "slurm").mkdir()
    slurm = slurm_up(base / "slurm") if args.backend == "slurm" else None
    kind = SlurmReplicas if slurm is not None else Cluster
    cluster = kind(base / "replicas", pg.port, url.rsplit("/", 1)[1], n=args.replicas,
                   lease_seconds=args.lease)
    times: list[float] = []
    result: dict = {}
    try:
        cluster.dir.mkdir(parents=True, exist_ok=True)
        cluster.start()
        for i in range(args.kills):
            fault = faults[i % len(faults)]
            leader = cluster.wait_leader()
            submit(cluster, args.backend, i)
            time.sleep(0.3)  # (the job starts: the fault falls while it launches or runs)
            t0 = time.time()
            if fault == "kill":
                leader.kill9()
            else:
                leader.pause()
            took = resumed(cluster, leader, t0)
            times.append(took)
            print(f"{fault} {i + 1}: {leader.name} -> scheduling resumed after {took:.2f} s",
                  flush=True)
            if fault == "kill":
                leader.start()
            else:
                leader.resume()  # it wakes up, finds the lease taken and stands by
        settle(url)
        time.sleep(3 * 0.3 + 1)  # a few cycles: what is left over is an orphan
        result = audit(url, args.backend, cluster.dir / "jobs")
    finally:
        cluster.stop()
        if slurm is not None:
            slurm.stop()
        pg.stop()
        shutil.rmtree(pg.datadir.parent, ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
    times.sort()
    p50 = times[len(times) // 2]
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
    print(f"failover over {len(times)} faults (lease {args.lease:g} s, {args.backend}): "
          f"p50 {p50:.2f} s, p95 {p95:.2f} s, max {times[-1]:.2f} s; {result}")
    print(json.dumps({"failover_p50_s": round(p50, 3), "failover_p95_s": round(p95, 3),
                      "failover_max_s": round(times[-1], 3), **result, "faults": len(times),
                      "fault_kinds": faults, "backend": args.backend,
                      "lease_s": args.lease, "replicas": args.replicas}))


if __name__ == "__main__":
    main()
