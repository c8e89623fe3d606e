"""Security review (medium): a 10 MB ``command`` and a 10 MB ``env`` were accepted (the ledger grew
31 MB, then "Argument list too long"). The body is limited (413 beyond) and so is every field
(400 naming it, limits in docs/service.md); nothing is stored."""

from __future__ import annotations

import http.client
import json
import os
from urllib.parse import urlparse

from jupyter_gpubudget.launcher import policy
from tests.fixtures.hub import http as call

MB10 = 10 * 1024 * 1024


def ledger_size(d) -> int:  # noqa: ANN001
    return sum(os.path.getsize(p) for p in (d / "ledger.sqlite", d / "ledger.sqlite-wal")
               if p.exists())


def test_oversized_bodies_and_fields_are_refused_and_nothing_is_stored(service_factory, tokens):
    svc = service_factory()
    bob, root = tokens["bob"], tokens["root"]
    before = len(call("GET", svc.api + "/jobs", bob)[1]["jobs"])
    size_before = ledger_size(svc.dir)
    job = {"project": "lattice", "gpus": 0}

    status, out = call("POST", svc.api + "/jobs", bob, {**job, "command": "x" * MB10})
    assert status == 413 and out["field"] == "body", (status, out)
    status, out = call("POST", svc.api + "/jobs", bob,
                       {**job, "command": "true", "env": {"BIG": "y" * MB10}})
    assert status == 413 and out["field"] == "body", (status, out)

    cases = [
        ({"command": "x" * (policy.MAX_COMMAND_CHARS + 1)}, "command"),
        ({"command": ["/bin/echo"] + ["a"] * policy.MAX_ARGV}, "command"),
        ({"command": ["/bin/echo", "a" * (policy.MAX_ARG_CHARS + 1)]}, "command[1]"),
        ({"command": "true", "env": {f"V{i}": "1" for i in range(policy.MAX_ENV + 1)}}, "env"),
        ({"command": "true", "env": {"V": "v" * (policy.MAX_ENV_VALUE_CHARS + 1)}}, "env.V"),
        ({"command": "true", "env": {"K" * (policy.MAX_ENV_KEY_CHARS + 1): "v"}}, "env"),
        ({"command": "true", "env": {"A=B": "v"}}, "env.A=B"),
        ({"command": "true", "name": "n" * (policy.MAX_NAME_CHARS + 1)}, "name"),
        ({"command": "true", "project": "p" * 300}, "project"),
    ]
    for extra, field in cases:
        status, out = call("POST", svc.api + "/jobs", bob, {**job, **extra})
        assert status == 400 and out["field"] == field, (field, status, out)
    status, out = call("PUT", svc.api + "/accounts/lattice/grant", root,
                       {"grant_hours": 5, "note": "n" * (policy.MAX_NOTE_CHARS + 1)})
    assert status == 400 and out["field"] == "note", out

    # a chunked body (no Content-Length) over the limit is refused the same way
    u = urlparse(svc.api)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    chunks = (json.dumps({**job, "command": "x" * (2 * 1024 * 1024)}).encode()[i:i + 65536]
              for i in range(0, 2 * 1024 * 1024 + 100, 65536))
    conn.request("POST", u.path + "/jobs", body=chunks, encode_chunked=True,
                 headers={"Authorization": f"token {bob}", "Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["field"] == "body"
    conn.close()

    assert len(call("GET", svc.api + "/jobs", bob)[1]["jobs"]) == before
    assert ledger_size(svc.dir) < size_before + 1024 * 1024
