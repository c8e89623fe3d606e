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
