"""One clock for charges and the lease: service replicas on one real PostgreSQL ledger whose
own clocks are 120 s ahead and 120 s behind the database's do not lead — they say why in
their log and ``/healthz`` — and a replica in step leads and charges by a clock the database
shares.

The offset is injected into each skewed replica's process through its config file (it
replaces ``GpuBudgetService.clock``, where the service reads its time): the one fake here,
since a real clock cannot be skewed per process on one machine."""

from __future__ import annotations

import time

import pytest

from jupyter_gpubudget.ledger import Ledger, connect
from tests.fixtures.hub import http
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import Cluster, Proxy, Replica

SKEWED_CLOCK = """\
import time
from jupyter_gpubudget.service.app import GpuBudgetService
GpuBudgetService.clock = staticmethod(lambda: time.time() + ({skew}))
"""


@pytest.fixture
def cluster(postgres_server, tmp_path):  # noqa: F811
    url = postgres_server.new_database()
    c = Cluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=0)
    try:
        c.start()  # the files only: the replicas are added by the test
        yield c
    finally:
        c.stop()
        from jupyter_gpubudget.backends.local import LocalBackend

        jobs = LocalBackend(state_dir=str(tmp_path / "jobs"), stop_grace=1)
        for wid, attempt in jobs.orphans(set()):
            jobs.stop(wid, attempt)


def add(cluster: Cluster, name: str, skew: float | None) -> Replica:
    extra = []
    if skew is not None:
        cfg = cluster.dir / f"clock-{name}.py"
        cfg.write_text(SKEWED_CLOCK.format(skew=skew))
        extra = [f"--GpuBudgetService.config_file={cfg}"]
    proxy = Proxy(cluster.pg_port)
    r = Replica(name, cluster.dir, f"postgresql://postgres@127.0.0.1:{proxy.port}/"
                f"{cluster.db_name}", proxy, lease_seconds=cluster.lease_seconds,
                extra_args=extra)
    cluster.replicas.append(r)
    r.start()
    return r


def health_reasons(r: Replica, want: str, timeout: float = 30.0) -> tuple[int, list[str]]:
    """/healthz once its reasons mention ``want`` (or what it said last, at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body = http("GET", r.api + "/healthz", timeout=5)
        reasons = body.get("reasons", []) if isinstance(body, dict) else []
        if any(want in x for x in reasons) or time.monotonic() > deadline:
            return status, reasons
        time.sleep(0.1)


def test_replicas_with_skewed_clocks_do_not_lead_and_say_why(cluster):
    ahead, behind = add(cluster, "ahead", 120.0), add(cluster, "behind", -120.0)
    for r, word in ((ahead, "ahead of"), (behind, "behind")):
        status, reasons = health_reasons(r, "clock")
        assert status == 503 and any(f"120.0 s {word} the ledger database's" in x
                                     for x in reasons), (r.name, status, reasons, r.log_tail())
        assert r.role() == "standby", r.log_tail()
        assert "does not lead" in r.log_tail(20000)
    # a replica in step takes the free lease and schedules; its charges agree with the
    # database's clock
    good = add(cluster, "good", None)
    assert cluster.wait_leader() is good
    status, job = cluster.call("POST", "/jobs", "bob", {
        "command": ["/bin/sh", "-c", "exec sleep 1"], "project": "lattice", "gpus": 1})
    assert status == 201, job
    url = good.db_url.replace(f":{good.proxy.port}/", f":{cluster.pg_port}/")
    engine = connect(url)
    try:
        ledger = Ledger(engine)
        deadline = time.monotonic() + 60
        while ledger.get(job["id"]).state != "done":
            assert time.monotonic() < deadline, (ledger.get(job["id"]).state, good.log_tail())
            time.sleep(0.2)
        (c,) = ledger.charges(workload=job["id"])
        with engine.connect() as conn:
            db_now = conn.exec_driver_sql("SELECT extract(epoch from now())").scalar()
        assert c.start <= c.end <= float(db_now)  # not from a clock 120 s ahead
        assert c.end - c.start >= 1.0  # nor one behind that ends it before it began
    finally:
        engine.dispose()
    assert ahead.role() == "standby" and behind.role() == "standby"
