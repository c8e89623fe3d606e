"""Service replicas on one real PostgreSQL ledger agree on one budgets file. A replica started
with another file (here: mallory a member of lattice, lattice's grant 70) while another leads
refuses to start, naming both files and digests; allowed by an admin
(``budgets_from_ledger``), it follows the ledger's copy: as a standby it authorises from it
(mallory reads nothing), and when it takes over it rewrites neither members nor grants — the
grant an admin set through the API survives the takeover."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from tests.fixtures.hub import BUDGETS, http
from tests.fixtures.postgres import postgres_server  # noqa: F401
from tests.fixtures.replicas import TOKENS, Cluster, Proxy, Replica

OTHER = BUDGETS.replace("lattice: {grant: 60, members: [bob]}",
                        "lattice: {grant: 70, members: [bob, mallory]}")
MALLORY = "mallory-token-0123456789abcdef"


@pytest.fixture
def cluster(postgres_server, tmp_path):  # noqa: F811
    url = postgres_server.new_database()
    c = Cluster(tmp_path, postgres_server.port, url.rsplit("/", 1)[1], n=1)
    try:
        c.start()  # replica a, with the fixtures' budgets file: it leads
        tok = tmp_path / "tokens.json"  # mallory has a token (no scope beyond reading)
        tokens = json.loads(tok.read_text())
        tokens[MALLORY] = {"name": "mallory", "scopes": ["custom:gpubudget:submit"]}
        tok.write_text(json.dumps(tokens))
        yield c
    finally:
        c.stop()


def other_replica(cluster: Cluster, budgets: str = OTHER, *extra: str) -> Replica:
    """Replica b, with ``budgets`` as its budgets file (in a directory of its own, beside
    the same inventory and tokens)."""
    own = cluster.dir / f"b-{hashlib.sha256(budgets.encode()).hexdigest()[:8]}"
    own.mkdir(exist_ok=True)
    (own / "budgets.yaml").write_text(budgets)
    for name in ("inventory.yaml", "tokens.json"):
        (own / name).write_bytes((cluster.dir / name).read_bytes())
    (own / "tokens.json").chmod(0o600)
    proxy = Proxy(cluster.pg_port)
    r = Replica("b", own, f"postgresql://postgres@127.0.0.1:{proxy.port}/{cluster.db_name}",
                proxy, lease_seconds=cluster.lease_seconds, extra_args=list(extra))
    cluster.replicas.append(r)
    return r


def test_a_replica_with_another_budgets_file_refuses_to_start(cluster):
    leader = cluster.wait_leader()
    b = other_replica(cluster)
    b.start(wait=False)
    assert b.proc.wait(60) == 2, b.log_tail()
    log = b.log_tail(5000)
    digest = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in (("a", BUDGETS),
                                                                      ("b", OTHER))}
    assert f"{b.dir / 'budgets.yaml'} (sha256 {digest['b']})" in log, log
    assert f"{cluster.dir / 'budgets.yaml'} on replica" in log and digest["a"] in log, log
    assert "budgets_from_ledger" in log
    assert cluster.wait_leader() is leader


def test_a_replica_allowed_to_follow_the_ledgers_copy_authorises_and_leads_by_it(cluster):
    a = cluster.wait_leader()
    root = TOKENS["root"][0]
    status, out = http("PUT", a.api + "/accounts/lattice/grant", root,
                       {"grant_hours": 50, "note": "an admin's grant"})
    assert status == 200, out
    b = other_replica(cluster, OTHER, "--GpuBudgetService.budgets_from_ledger=True")
    b.start()
    assert b.role() == "standby"
    # a standby authorises from the ledger's copy, not from its own file
    status, out = http("GET", b.api + "/accounts/lattice", MALLORY)
    assert status == 403, (status, out)
    status, out = http("GET", b.api + "/accounts/lattice", root)
    assert status == 200 and out["members"] == ["bob"], out
    # it takes over: nothing of its file is written
    a.kill9()
    assert cluster.wait_leader(not_=a) is b
    status, out = http("GET", b.api + "/accounts/lattice", root)
    assert status == 200, out
    assert out["members"] == ["bob"] and out["grant"]["grant_hours"] == 50, out
    status, hist = http("GET", b.api + "/accounts/lattice/grants", root)
    assert [v["grant_hours"] for v in hist["versions"]] == [60, 50], hist
    status, out = http("GET", b.api + "/accounts/lattice", MALLORY)
    assert status == 403, (status, out)
    assert "leading with the ledger's copy" in b.log_tail(20000)


def test_the_leaders_own_edit_is_the_copy_the_standbys_follow(cluster):
    """An admin edits the budgets file on the leader: the ledger's copy changes with its
    accounts, and a standby — whose own file (the same as a's was) is unchanged —
    authorises from the new copy."""
    a = cluster.wait_leader()
    b = other_replica(cluster, BUDGETS)
    b.start()
    assert b.role() == "standby"
    assert http("GET", b.api + "/accounts/lattice", MALLORY)[0] == 403
    (cluster.dir / "budgets.yaml").write_text(OTHER)  # a's file
    deadline = time.monotonic() + 30
    while http("GET", b.api + "/accounts/lattice", MALLORY)[0] != 200:
        assert time.monotonic() < deadline, b.log_tail()
        time.sleep(0.2)
    assert a.role() == "leader"
