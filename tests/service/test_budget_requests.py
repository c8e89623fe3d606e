"""Asking for more budget through the real service and hub: a member's request reaches the
project's manager as a notice, who grants it (the project's grant changes through the grant
change, within the parent's grant, audited with who asked and who approved) or declines it
with a reason; the member is told either way. Scopes per verb, 400s that change nothing, the
CLI, and the notices' delivery to a user's webhook."""

from __future__ import annotations

import pytest

from tests.fixtures.hub import ServiceProc, http
from tests.service.conftest import cleanup


@pytest.fixture(scope="module")
def svc(hub, tokens, tmp_path_factory):
    d = tmp_path_factory.mktemp("svc-requests")
    s = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    s.start()
    yield s
    cleanup(s, tokens["root"])


def _requests(svc, token, state="pending,granted,declined"):  # noqa: ANN001, ANN202
    status, body = http("GET", f"{svc.api}/budget-requests?state={state}", token)
    assert status == 200, body
    return body["requests"]


def _titles(svc, token):  # noqa: ANN001, ANN202
    status, body = http("GET", f"{svc.api}/notices", token)
    assert status == 200, body
    return [n["title"] for n in body["notices"]]


def _grant(svc, token, account):  # noqa: ANN001, ANN202
    status, body = http("GET", f"{svc.api}/accounts/{account}/grants", token)
    assert status == 200, body
    return body["versions"][-1]


@pytest.mark.parametrize("body,field", [
    ({"project": "lattice", "gpu_hours": 10}, "reason"),
    ({"project": "lattice", "gpu_hours": 10, "reason": "   "}, "reason"),
    ({"project": "lattice", "gpu_hours": -1, "reason": "x"}, "gpu_hours"),
    ({"project": "lattice", "gpu_hours": 0, "reason": "x"}, "gpu_hours"),
    ({"project": "lattice", "gpu_hours": "ten", "reason": "x"}, "gpu_hours"),
    ({"project": "lattice", "gpu_hours": 1e12, "reason": "x"}, "gpu_hours"),
    ({"project": "lattice", "gpu_hours": 10, "reason": "x", "extra": 1}, "extra"),
    ({"project": "nosuch", "gpu_hours": 10, "reason": "x"}, "project"),
    ({"project": "physics", "gpu_hours": 10, "reason": "x"}, "project"),  # not a project
    ({"gpu_hours": 10, "reason": "x"}, "project"),
    (["lattice"], "body"),
])
def test_bad_requests_are_400_naming_the_field_and_change_nothing(svc, tokens, body, field):
    before = _requests(svc, tokens["root"])
    status, out = http("POST", f"{svc.api}/budget-requests", tokens["bob"], body)
    assert status == 400 and out["field"] == field, out
    assert _requests(svc, tokens["root"]) == before


def test_a_request_reaches_the_manager_is_granted_and_the_member_is_told(svc, hub, tokens):
    bob, alice, root = tokens["bob"], tokens["alice"], tokens["root"]
    # a read-only token may not ask; a member asks only for their own projects
    status, out = http("POST", f"{svc.api}/budget-requests",
                       hub.token("bob", scopes=["custom:gpubudget:read"]),
                       {"project": "lattice", "gpu_hours": 10, "reason": "thesis runs"})
    assert status == 403 and "custom:gpubudget:submit" in out["message"]
    status, out = http("POST", f"{svc.api}/budget-requests", bob,
                       {"project": "astro", "gpu_hours": 10, "reason": "x"})
    assert status == 403 and "not a member" in out["message"]
    status, req = http("POST", f"{svc.api}/budget-requests", bob,
                       {"project": "lattice", "gpu_hours": 10, "reason": "thesis runs"})
    assert status == 201, req
    assert req["state"] == "pending" and req["notified"] == ["alice"]
    status, out = http("POST", f"{svc.api}/budget-requests", bob,
                       {"project": "lattice", "gpu_hours": 5, "reason": "again"})
    assert status == 409  # one pending request per member and project
    # the manager is told, and sees it; another member does not
    assert "bob asks for 10 more GPU-hours for project lattice" in _titles(svc, alice)
    assert [r["id"] for r in _requests(svc, alice, "pending")] == [req["id"]]
    assert _requests(svc, alice, "pending")[0]["may_decide"] is True
    assert _requests(svc, tokens["dave"]) == []
    assert not [t for t in _titles(svc, tokens["dave"]) if "asks for" in t]
    # bob may not grant his own request; alice's read-only token may not either
    rid = req["id"]
    status, out = http("POST", f"{svc.api}/budget-requests/{rid}/grant", bob, {})
    assert status == 403
    status, out = http("POST", f"{svc.api}/budget-requests/{rid}/grant",
                       hub.token("alice", scopes=["custom:gpubudget:read"]), {})
    assert status == 403 and "custom:gpubudget:manage" in out["message"]
    # through the grant change's own checks: lattice 70 + astro 40 would exceed physics' 100
    status, out = http("POST", f"{svc.api}/budget-requests/{rid}/grant", alice, {})
    assert status == 403 and "physics" in out["message"], out
    assert _grant(svc, root, "lattice")["grant_hours"] == 60
    assert _requests(svc, alice, "pending")[0]["state"] == "pending"
    # the admin raises physics; now alice can grant
    status, _ = http("PUT", f"{svc.api}/accounts/physics/grant", root, {"grant_hours": 120})
    assert status == 200
    status, out = http("POST", f"{svc.api}/budget-requests/{rid}/grant", alice,
                       {"note": "go ahead"})
    assert status == 200, out
    assert out["request"]["state"] == "granted" and out["grant"]["grant_hours"] == 70
    g = _grant(svc, root, "lattice")
    assert g["grant_hours"] == 70 and g["changed_by"] == "alice"
    assert out["request"]["grant_version"] == g["version"]
    status, out = http("POST", f"{svc.api}/budget-requests/{rid}/grant", alice, {})
    assert status == 409  # answered already: nothing granted twice
    assert _grant(svc, root, "lattice")["grant_hours"] == 70
    # the audit entry of the grant says who asked and who approved
    status, audit = http("GET", f"{svc.api}/decisions?kind=grant", root)
    entry = next(d for d in audit["decisions"] if (d.get("detail") or {}).get("account")
                 == "lattice" and (d.get("detail") or {}).get("version") == g["version"])
    assert entry["detail"]["requested_by"] == "bob" and entry["detail"]["approved_by"] == "alice"
    # bob is told
    assert "Your request for 10 more GPU-hours for lattice was granted" in _titles(svc, bob)
    status, notices = http("GET", f"{svc.api}/notices", bob)
    granted = next(n for n in notices["notices"] if n["kind"] == "budget-granted")
    assert "70 GPU-hours" in granted["body"] and "go ahead" in granted["body"]


def test_a_declined_request_keeps_the_grant_and_says_why(svc, tokens):
    bob, alice, root = tokens["bob"], tokens["alice"], tokens["root"]
    before = _grant(svc, root, "lattice")["grant_hours"]
    status, req = http("POST", f"{svc.api}/budget-requests", bob,
                       {"project": "lattice", "gpu_hours": 500, "reason": "a big sweep"})
    assert status == 201
    url = f"{svc.api}/budget-requests/{req['id']}/decline"
    status, out = http("POST", url, alice, {})
    assert status == 400 and out["field"] == "reason"
    status, out = http("POST", url, alice, {"reason": "   "})
    assert status == 400 and out["field"] == "reason"
    status, out = http("POST", f"{svc.api}/budget-requests/99999/decline", alice,
                       {"reason": "x"})
    assert status == 404
    status, out = http("POST", url, alice, {"reason": "no budget left this quarter"})
    assert status == 200 and out["request"]["state"] == "declined"
    assert _grant(svc, root, "lattice")["grant_hours"] == before
    status, notices = http("GET", f"{svc.api}/notices", bob)
    declined = next(n for n in notices["notices"] if n["kind"] == "budget-declined")
    assert "no budget left this quarter" in declined["body"]
    assert declined["title"] == "Your request for 500 more GPU-hours for lattice was declined"


def test_the_cli_asks_lists_and_declines(svc, tokens, capsys):
    from jupyter_gpubudget.cli import main

    def run(token, *argv):  # noqa: ANN001, ANN002, ANN202
        rc = main(["budget", *argv, f"--url={svc.base}", f"--token={token}"])
        out = capsys.readouterr()
        return rc, out.out + out.err

    rc, out = run(tokens["dave"], "request", "astro", "--gpu-hours", "7.5", "--reason",
                  "a deadline")
    assert rc == 0 and "7.5 more GPU-hours per window for astro" in out and "alice" in out
    rid = int(out.split()[1].rstrip(":"))
    rc, out = run(tokens["alice"], "requests")
    assert rc == 0 and "astro" in out and "a deadline" in out
    rc, out = run(tokens["dave"], "decline", str(rid), "--reason", "no")
    assert rc == 1 and "403" in out
    rc, out = run(tokens["alice"], "decline", str(rid), "--reason", "next month")
    assert rc == 0 and f"request {rid} declined" in out
    rc, out = run(tokens["dave"], "request", "astro", "--gpu-hours", "-3", "--reason", "x")
    assert rc == 1 and "gpu_hours" in out


def test_request_notices_are_delivered_like_the_others(tmp_path):
    """The delivery round's reading (``delivery.pending_notices``) includes requests and
    answers for users with a delivery preference, in decision order."""
    from jupyter_gpubudget.core.accounts import load_budgets
    from jupyter_gpubudget.ledger import Ledger, connect, upgrade
    from jupyter_gpubudget.ledger import budget_requests as br
    from jupyter_gpubudget.service.delivery import pending_notices, set_pref
    from tests.fixtures.hub import BUDGETS

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    upgrade(url)
    led = Ledger(connect(url))
    try:
        led.sync_budgets(load_budgets(BUDGETS), now=1.0)
        set_pref(led, "alice", "https://chat.example.org/hook", None, 2.0)
        set_pref(led, "bob", "https://chat.example.org/bob", None, 2.0)
        with led.tx() as s:
            row = br.create(s, project="lattice", user="bob", gpu_hours=4, reason="more",
                            now=3.0, notify=["alice"])
        with led.tx() as s:
            br.decide(s, br.pending(s, row.id), state="declined", by="alice", now=4.0,
                      note="not now")
        got = [(u, n.kind, n.title) for _, u, n, _ in pending_notices(led, 0)]
        assert got == [("alice", "budget-request",
                        "bob asks for 4 more GPU-hours for project lattice"),
                       ("bob", "budget-declined",
                        "Your request for 4 more GPU-hours for lattice was declined")]
    finally:
        led.dispose()
