"""Security review (low): 100,000-deep JSON, a lone surrogate in a name, and on PostgreSQL a NUL in
a name, a note or a path gave 500 (RecursionError, UnicodeEncodeError, DataError). Each is a
400 naming the field, on SQLite and on PostgreSQL, and nothing is stored."""

from __future__ import annotations

import pytest

from tests.fixtures.hub import http


@pytest.fixture(params=["sqlite", "postgresql"])
def svc(request, service_factory):
    url = None
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_server").new_database()
    return service_factory(db_url=url)


def test_hostile_json_gets_400_naming_the_field(svc, tokens):
    bob, root = tokens["bob"], tokens["root"]
    deep = b"[" * 100_000 + b"]" * 100_000
    status, out = http("POST", svc.api + "/jobs", bob, deep)
    assert status == 400 and out["field"] == "body", (status, out)
    deep_obj = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    status, out = http("POST", svc.api + "/jobs", bob, deep_obj)
    assert status == 400 and out["field"] == "body", (status, out)

    lone = b'{"command": "true", "project": "lattice", "gpus": 0, "name": "x\\ud800y"}'
    status, out = http("POST", svc.api + "/jobs", bob, lone)
    assert status == 400 and out["field"] == "name", (status, out)
    status, out = http("POST", svc.api + "/jobs", bob, {
        "command": "true", "project": "lattice", "gpus": 0, "name": "a\u0000b"})
    assert status == 400 and out["field"] == "name", (status, out)
    status, out = http("POST", svc.api + "/jobs", bob, {
        "command": "true", "project": "latt\u0000ice", "gpus": 0})
    assert status == 400 and out["field"] == "project", (status, out)
    status, out = http("PUT", svc.api + "/accounts/lattice/grant", root,
                       {"grant_hours": 5, "note": "a\u0000b"})
    assert status == 400 and out["field"] == "note", (status, out)
    status, out = http("PUT", svc.api + "/accounts/lattice/grant", root,
                       {"grant_hours": 5, "note": "\ud800"})
    assert status == 400 and out["field"] == "note", (status, out)
    for path in ("/accounts/lat%00tice", "/workloads/ab%00cd", "/accounts/lattice%00/usage",
                 "/jobs/x%00y", "/workloads/me?state=do%00ne"):
        method = "DELETE" if path.startswith("/jobs/") else "GET"
        status, out = http(method, svc.api + path, root)
        assert status == 400, (path, status, out)
    assert http("GET", svc.api + "/jobs", bob)[1]["jobs"] == []
    grants = http("GET", svc.api + "/accounts/lattice/grants", root)[1]
    assert all("\x00" not in (g.get("note") or "") for g in grants["versions"])
