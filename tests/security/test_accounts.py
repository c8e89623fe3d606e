"""Security review (high): jobs run as the submitting user's Unix account (the hub user is mapped as
``LocalProcessSpawner`` does, ``LocalBackend.unix_user_template``), never as root or a system
account. A user without a usable account is refused at submission with a 403 naming the
account, instead of a launch failure later."""

from __future__ import annotations

import pwd

import pytest

from tests.fixtures.hub import http
from tests.fixtures.unixusers import PREFIX

from .conftest import require_root, wait_state


@pytest.mark.parametrize("template, says", [
    ("nosuch-{username}", "no Unix account 'nosuch-bob'"),
    ("root", "jobs never run as root"),
    ("daemon", "system account 'daemon'"),
    ("nobody", "may not run jobs"),
])
def test_no_usable_account_is_refused_at_submission(service_factory, tokens, template, says):
    require_root()
    svc = service_factory(f"--LocalBackend.unix_user_template={template}")
    status, out = http("POST", svc.api + "/jobs", tokens["bob"],
                       {"command": "id -u", "project": "lattice", "gpus": 0})
    assert status == 403 and out["field"] == "user" and says in out["message"], out
    assert http("GET", svc.api + "/jobs", tokens["bob"])[1]["jobs"] == []


def test_a_job_runs_as_the_mapped_account_in_its_home(service_factory, tokens):
    require_root()
    svc = service_factory()  # hub user bob -> Unix account gbt-bob (tests.fixtures.unixusers)
    status, job = http("POST", svc.api + "/jobs", tokens["bob"],
                       {"command": "id -u; pwd", "project": "lattice", "gpus": 0})
    assert status == 201, job
    assert wait_state(svc, tokens["bob"], job["id"], ("done", "failed"))["state"] == "done"
    pw = pwd.getpwnam(PREFIX + "bob")
    out = (svc.dir / "jobs" / job["id"] / "1" / "output.log").read_text().split()
    assert out == [str(pw.pw_uid), pw.pw_dir] and pw.pw_uid != 0


# --------------------------------------------------------------- a manager funds their own
#: alice manages physics and works in lattice (a member); dave manages physics too and works
#: in astro; root is the admin
SELF_FUNDING = """\
admins: [root]
{policy}accounts:
  physics:
    grant: 100
    managers: [alice, dave]
    children:
      lattice: {{grant: 60, members: [bob, alice]}}
      astro: {{grant: 40, members: [dave]}}
  biology:
    grant: 50
    children:
      genomics: {{grant: 50, members: [erin]}}
"""


def _grants(svc, root: str) -> dict[str, float]:
    return {a: http("GET", f"{svc.api}/accounts/{a}", root)[1]["grant"]["grant_hours"]
            for a in ("physics", "lattice", "astro")}


def _grant_audit(svc, root: str) -> list[dict]:
    st, out = http("GET", f"{svc.api}/audit?what=grants&account=physics", root)
    assert st == 200, out
    return [e for e in out["entries"] if e["who"] != "file:budgets.yaml"
            and not e["who"].startswith("file:")]


def test_a_manager_cannot_move_the_programs_grant_into_their_own_project(service_factory,
                                                                         tokens):
    """The attack: alice (manager of physics, member of lattice) empties astro — allowed, it
    funds nobody — then gives lattice the whole of physics' grant: refused (403 naming who
    may approve), nothing changes; dave (another manager of physics, not a member of
    lattice) makes it for her and the audit entry says who asked and who approved."""
    svc = service_factory(budgets=SELF_FUNDING.format(policy=""))
    root, alice, dave = tokens["root"], tokens["alice"], tokens["dave"]
    st, out = http("PUT", f"{svc.api}/accounts/astro/grant", alice, {"grant_hours": 0})
    assert st == 200, out
    before = _grants(svc, root)
    versions = http("GET", f"{svc.api}/accounts/lattice/grants", root)[1]["versions"]
    for body in ({"grant_hours": 100}, {"grant_hours": 60.5}, {"share_pct": 100}):
        st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", alice, body)
        assert st == 403, (body, out)
        msg = out["message"]
        assert "member of 'lattice'" in msg and "'physics'" in msg, msg
        assert "dave, root" in msg and "managers_fund_own_projects" in msg, msg
    # the preview says the same before anything is saved
    st, out = http("POST", f"{svc.api}/accounts/lattice/grant/preview", alice,
                   {"grant_hours": 100})
    assert st == 200 and "member of 'lattice'" in (out["refused"] or ""), out
    assert _grants(svc, root) == before
    assert http("GET", f"{svc.api}/accounts/lattice/grants", root)[1]["versions"] == versions
    # lowering her own project funds nobody: hers to do
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", alice, {"grant_hours": 50})
    assert st == 200, out
    # dave manages physics and is no member of lattice: he makes it for her (approves it)
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", dave,
                   {"grant_hours": 100, "requested_by": "alice", "note": "the big run"})
    assert st == 200, out
    assert _grants(svc, root)["lattice"] == 100
    entry = _grant_audit(svc, root)[0]
    assert (entry["account"], entry["who"], entry["approved_by"], entry["requested_by"]) == (
        "lattice", "dave", "dave", "alice"), entry
    assert "asked by alice, approved by dave" in entry["change"], entry
    csv = http("GET", f"{svc.api}/audit?what=grants&format=csv", root)[1]
    assert "approved by dave" in csv, csv
    # dave funding astro (where he is a member) is refused the same way; alice may approve
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", dave, {"grant_hours": 60})
    assert st == 200, out
    st, out = http("PUT", f"{svc.api}/accounts/astro/grant", dave, {"grant_hours": 40})
    assert st == 403 and "member of 'astro'" in out["message"], out
    assert "alice, root" in out["message"], out
    st, out = http("PUT", f"{svc.api}/accounts/astro/grant", alice,
                   {"grant_hours": 40, "requested_by": "dave"})
    assert st == 200, out
    # an admin changes any grant; one that funds nobody they work in needs no approval
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", root, {"grant_hours": 60})
    assert st == 200, out
    entry = _grant_audit(svc, root)[0]
    assert (entry["who"], entry["approved_by"]) == ("root", None), entry
    # a bad requested_by is a 400 naming the field, and changes nothing
    before = _grants(svc, root)
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", dave,
                   {"grant_hours": 55, "requested_by": "../../etc"})
    assert st == 400 and out["field"] == "requested_by", out
    assert _grants(svc, root) == before


def test_the_policy_key_lets_managers_fund_their_own_projects(service_factory, tokens):
    svc = service_factory(budgets=SELF_FUNDING.format(
        policy="policy:\n  managers_fund_own_projects: true\n"))
    root, alice = tokens["root"], tokens["alice"]
    st, out = http("PUT", f"{svc.api}/accounts/astro/grant", alice, {"grant_hours": 0})
    assert st == 200, out
    st, out = http("PUT", f"{svc.api}/accounts/lattice/grant", alice, {"grant_hours": 100})
    assert st == 200, out
    entry = _grant_audit(svc, root)[0]
    assert (entry["who"], entry["approved_by"]) == (
        "alice", "policy:managers_fund_own_projects"), entry
    assert "approved by the budgets file's policy managers_fund_own_projects" in \
        entry["change"], entry


def test_the_policy_key_is_validated_with_a_clear_error():
    from jupyter_gpubudget.core.accounts import BudgetError, load_budgets

    ok = load_budgets(SELF_FUNDING.format(policy="policy: {managers_fund_own_projects: true}\n"))
    assert ok.policy.managers_fund_own_projects is True
    assert load_budgets(SELF_FUNDING.format(policy="")).policy.managers_fund_own_projects \
        is False
    with pytest.raises(BudgetError) as info:
        load_budgets(SELF_FUNDING.format(policy="policy:\n  managers_fund_own_projects: "
                                                "sometimes\n"), "budgets.yaml")
    e = info.value
    assert (e.path, e.line) == ("policy.managers_fund_own_projects", 3), e
    assert "expected true or false, got str 'sometimes'" in str(e), e


def test_who_funds_whom_in_the_core():
    """The pure rule: what a change raises that its maker charges as a member; who may
    approve it (admins, and the parent's other managers who are no members of it)."""
    from jupyter_gpubudget.core.accounts import grant_approvers, load_budgets, self_funded

    tree = load_budgets(SELF_FUNDING.format(policy="")).accounts
    more = tree.with_grant("lattice", 90.0)
    assert self_funded(tree, more, "alice", 1000.0) == ("lattice",)
    assert self_funded(tree, more, "dave", 1000.0) == ()
    assert self_funded(tree, more, "bob", 1000.0) == ("lattice",)  # a member, whoever
    assert self_funded(more, tree, "alice", 1000.0) == ()  # lowering funds nobody
    assert self_funded(tree, tree.with_grant("astro", 50.0), "alice", 1000.0) == ()
    assert grant_approvers(tree, "lattice", frozenset({"root"}), ("lattice",)) == (
        "dave", "root")
    assert grant_approvers(tree, "astro", frozenset({"root"}), ("astro",)) == (
        "alice", "root")
