"""Members' limits against the real service process: the budgets file's limit shows on the
spawn form's quote in words; a manager above the project sets and clears one through the
accounts API (audited) and the quote follows; a manager of another subtree gets 403; bad
limits get 400 naming the field; neither changes anything."""

from __future__ import annotations

import pytest

from tests.fixtures.hub import BUDGETS, ServiceProc, http
from tests.service.conftest import cleanup
from tests.service.test_api import wait_for

LIMITED = BUDGETS.replace(
    "lattice: {grant: 60, members: [bob]}",
    "lattice: {grant: 60, members: [bob], member_limits: {bob: {gpus: 0}}}").replace(
    "  biology:\n    grant: 50\n", "  biology:\n    grant: 50\n    managers: [erin]\n")


@pytest.fixture(scope="module")
def limited(hub, tokens, tmp_path_factory):  # noqa: ANN001, ANN201
    assert LIMITED.count("member_limits") == 1 and "managers: [erin]" in LIMITED
    d = tmp_path_factory.mktemp("svc-limits")
    (d / "budgets.yaml").write_text(LIMITED)
    svc = ServiceProc(hub, d, f"sqlite:///{d / 'ledger.sqlite'}")
    svc.start()
    yield svc
    cleanup(svc, tokens["root"])


def quote(svc: ServiceProc, token: str, min_runtime: str = "2h") -> dict:
    st, out = wait_for(lambda: (r := http(
        "GET", f"{svc.api}/sessions/quote?project=lattice&gpus=1&min_runtime={min_runtime}",
        token))[0] != 503 and r, "a first cycle")
    assert st == 200, out
    return out["quote"]


def limits(svc: ServiceProc, token: str) -> dict:
    st, out = http("GET", f"{svc.api}/accounts/lattice/member_limits", token)
    assert st == 200, out
    return out["member_limits"]


def test_the_budgets_files_limit_shows_on_the_quote(limited, tokens):  # noqa: ANN001
    q = quote(limited, tokens["bob"])
    assert not q["backed"] and q["protected_s"] == 0
    assert q["note"] == "over your member limit in lattice: 0 of 0 GPUs running — runs unbacked"
    assert q["member_limit"] == {"limit": "gpus", "used": 0.0, "of": 0.0, "adds": 1.0}
    assert limits(limited, tokens["bob"]) == {"bob": {"gpu_hours": None, "gpus": 0.0}}
    # the sidebar's account card says so too (GET /accounts: the caller's own limit)
    st, out = http("GET", f"{limited.api}/accounts", tokens["bob"])
    assert st == 200, out
    mine = {a["name"]: a.get("my_limit") for a in out["accounts"]}
    assert mine["lattice"] == {
        "gpu_hours": None, "gpus": 0.0, "used_hours": 0.0, "running_gpus": 0.0, "over": True,
        "text": "over your member limit in lattice: 0 of 0 GPUs running — runs unbacked"}
    assert mine["physics"] is None  # a program has no members' limits
    st, out = http("GET", f"{limited.api}/accounts", tokens["alice"])  # not limited herself
    assert all("my_limit" not in a for a in out["accounts"]), out


def test_a_manager_above_the_project_sets_and_clears_a_limit(limited, tokens):  # noqa: ANN001
    url = f"{limited.api}/accounts/lattice/member_limits/bob"
    st, out = http("PUT", url, tokens["alice"], {"gpu_hours": 1, "note": "one a week"})
    assert st == 200, out
    assert out == {"account": "lattice", "user": "bob", "limit": {"gpu_hours": 1.0, "gpus": None}}
    assert limits(limited, tokens["bob"]) == {"bob": {"gpu_hours": 1.0, "gpus": None}}
    words = ("past your member limit in lattice with this: 0 of 1 GPU-h, 2 more protected "
             "GPU-h — runs unbacked")
    q = wait_for(lambda: (q := quote(limited, tokens["bob"])).get("note") == words and q,
                 "the quote to show the new limit")
    assert not q["backed"]
    # within it, the session is backed
    assert quote(limited, tokens["bob"], "30m")["backed"]
    st, out = http("DELETE", url, tokens["alice"])
    assert st == 200 and out["limit"] is None, out
    assert limits(limited, tokens["bob"]) == {}
    wait_for(lambda: quote(limited, tokens["bob"])["backed"], "the quote to be backed again")
    # both changes are in the audit log, newest first, where the project's managers see them
    st, audit = http("GET", f"{limited.api}/audit?what=grants&account=lattice", tokens["alice"])
    assert st == 200, audit
    entries = [(e["who"], e["account"], e["change"], e["why"]) for e in audit["entries"]
               if e["kind"] == "member_limit"]
    assert entries[:2] == [("alice", "lattice", "bob's limit cleared", ""),
                           ("alice", "lattice", "bob's limit set to 1.0 GPU-h per window",
                            "one a week")], entries


def test_a_manager_of_another_subtree_is_refused_and_nothing_changes(limited, tokens):  # noqa: ANN001
    before = limits(limited, tokens["root"])
    url = f"{limited.api}/accounts/lattice/member_limits/bob"
    for method, body in (("PUT", {"gpus": 8}), ("DELETE", None)):
        st, out = http(method, url, tokens["erin"], body)
        assert st == 403 and "does not manage project 'lattice'" in out["message"], out
    st, out = http("PUT", url, tokens["bob"], {"gpus": 8})  # a member caps nobody
    assert st == 403, out
    assert limits(limited, tokens["root"]) == before


@pytest.mark.parametrize(("user", "body", "field"), [
    ("bob", {"gpus": -1}, "gpus"),
    ("bob", {"gpus": "four"}, "gpus"),
    ("bob", {"gpu_hours": True}, "gpu_hours"),
    ("bob", {"gpu_hours": 1e12}, "gpu_hours"),
    ("bob", {"gpus": 10 ** 30}, "gpus"),
    ("bob", {"gpus": 10 ** 400}, "gpus"),
    ("bob", {"gpu_hours": 1.00001}, "gpu_hours"),
    ("bob", {}, "gpu_hours"),
    ("bob", {"gpus": 1, "cpus": 2}, "cpus"),
    ("bob", [1], "body"),
    ("b%20b", {"gpus": 1}, "user"),
    ("-bob", {"gpus": 1}, "user"),
    ("dave", {"gpus": 1}, "user"),  # a member of astro, not of lattice
])
def test_bad_limits_are_refused_naming_the_field(limited, tokens, user, body, field):  # noqa: ANN001
    before = limits(limited, tokens["root"])
    st, out = http("PUT", f"{limited.api}/accounts/lattice/member_limits/{user}",
                   tokens["alice"], body)
    assert st == 400 and out.get("field") == field, out
    assert out["message"].startswith(f"{field}:"), out
    assert limits(limited, tokens["root"]) == before


def test_a_limit_goes_on_a_project(limited, tokens):  # noqa: ANN001
    st, out = http("PUT", f"{limited.api}/accounts/physics/member_limits/bob",
                   tokens["root"], {"gpus": 1})
    assert st == 400 and out["field"] == "account", out
    st, out = http("PUT", f"{limited.api}/accounts/nowhere/member_limits/bob",
                   tokens["root"], {"gpus": 1})
    assert st == 404, out


def test_the_cli_sets_and_clears_a_limit(limited, tokens, capsys):  # noqa: ANN001
    from jupyter_gpubudget.cli import main

    args = [f"--url={limited.base}", f"--token={tokens['alice']}"]
    assert main(["budget", "limit", "lattice", "bob", "--gpu-hours", "200", "--gpus", "4",
                 *args]) == 0
    assert capsys.readouterr().out.strip() == (
        "bob in lattice: limited to 200 GPU-h per window and 4 GPUs at once (past it, their "
        "work runs unbacked)")
    assert limits(limited, tokens["bob"]) == {"bob": {"gpu_hours": 200.0, "gpus": 4.0}}
    assert main(["budget", "limit", "lattice", "bob", "--clear", *args]) == 0
    assert capsys.readouterr().out.strip() == "bob in lattice: no limit"
    assert main(["budget", "limit", "lattice", "bob", "--gpus", "-1", *args]) == 1
    assert "gpus: must be a number from 0" in capsys.readouterr().err
    assert limits(limited, tokens["bob"]) == {}
