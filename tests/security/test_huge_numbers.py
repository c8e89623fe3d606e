"""Huge numbers, found by attacking the demo hub as a hostile user.

7. A 400-digit integer in ``min_runtime``, ``time_limit``, ``share_pct``, ``grant_hours``, the
   grant preview, ``/usage/events`` ``at`` or ``GET /decisions?before=`` was answered 500
   (``OverflowError``: the number does not fit a float or a database integer). Each is a 400
   naming the field, and nothing changes.
10. A grant of ``-0.0`` or ``1e-320`` GPU-hours was stored. A grant is a finite number >= 0
   in steps of 0.001 GPU-hours (a share in steps of 0.001 %): -0.0, subnormals and finer
   fractions are refused, 400 naming the field (docs/service.md, "Limits")."""

from __future__ import annotations

from tests.fixtures.hub import http

HUGE = 10 ** 400  # json.dumps writes its 401 digits; Python reads them back as an int


def snapshot(svc, root) -> tuple:  # noqa: ANN001
    """What a refused request must leave as it was: jobs, sessions, grants, decisions."""
    jobs = http("GET", svc.api + "/jobs", root)[1]["jobs"]
    sessions = http("GET", svc.api + "/sessions", root)[1]["sessions"]
    grants = {a: http("GET", f"{svc.api}/accounts/{a}/grants", root)[1]["versions"]
              for a in ("lattice", "astro", "physics")}
    decisions = http("GET", svc.api + "/decisions?limit=1000", root)[1]
    return (sorted(j["id"] for j in jobs), sorted(s["id"] for s in sessions), grants,
            [d["id"] for d in decisions["decisions"]])


def test_huge_integers_are_a_400_naming_the_field_and_change_nothing(service_factory, tokens):
    svc = service_factory()
    bob, root = tokens["bob"], tokens["root"]
    before = snapshot(svc, root)
    job = {"command": "true", "project": "lattice", "gpus": 0}
    cases = [
        ("POST", "/jobs", bob, {**job, "min_runtime": HUGE}, "min_runtime"),
        ("POST", "/jobs", bob, {**job, "time_limit": HUGE}, "time_limit"),
        ("POST", "/jobs", bob, {**job, "checkpoint_interval": -HUGE}, "checkpoint_interval"),
        ("POST", "/sessions", root, {"user": "bob", "project": "lattice", "slice": "cpu",
                                     "min_runtime": HUGE}, "min_runtime"),
        ("PUT", "/accounts/lattice/grant", root, {"share_pct": HUGE}, "share_pct"),
        ("PUT", "/accounts/lattice/grant", root, {"grant_hours": HUGE}, "grant_hours"),
        ("PUT", "/accounts/lattice/grant", root, {"grant_hours": -HUGE}, "grant_hours"),
        ("POST", "/accounts/lattice/grant/preview", root, {"grant_hours": HUGE},
         "grant_hours"),
        ("POST", "/accounts/lattice/grant/preview", root, {"share_pct": HUGE}, "share_pct"),
        ("POST", "/usage/events", root, {"workload": "ext-1", "event": "stop", "at": HUGE},
         "at"),
        ("POST", "/usage/events", root, {"workload": "ext-1", "event": "start", "at": 1.0,
                                         "project": "lattice", "user": "bob", "milli": HUGE},
         "milli"),
        ("GET", f"/decisions?before={HUGE}", root, None, "before"),
        ("GET", f"/decisions?before=-{HUGE}", root, None, "before"),
        ("GET", f"/decisions?limit={HUGE}", root, None, "limit"),
    ]
    for method, path, tok, body, field in cases:
        status, out = http(method, svc.api + path, tok, body)
        assert status == 400 and isinstance(out, dict) and out.get("field") == field, \
            (path, field, status, out)
        assert field in out["message"], out
    # the admin pages' own "older entries" argument: a 400 page naming it, never a 500
    for page in ("decisions", "audit"):
        status, out = http("GET", f"{svc.base}/{page}?before={HUGE}", root)
        assert status in (200, 400) and status != 500, (page, status, out)
        if page == "decisions":
            assert status == 400 and "before" in str(out), out
    assert snapshot(svc, root) == before
    # the service is still well (no failed request left a mark on /healthz)
    assert http("GET", svc.api + "/healthz")[0] == 200


def test_grants_are_finite_non_negative_multiples_of_a_thousandth(service_factory, tokens):
    svc = service_factory()
    root = tokens["root"]
    before = snapshot(svc, root)
    for body, field in [
        ({"grant_hours": -0.0}, "grant_hours"),
        ({"grant_hours": 1e-320}, "grant_hours"),  # a subnormal
        ({"grant_hours": 5e-324}, "grant_hours"),
        ({"grant_hours": 1e-4}, "grant_hours"),
        ({"grant_hours": 12.0005}, "grant_hours"),
        ({"grant_hours": -1}, "grant_hours"),
        ({"share_pct": -0.0}, "share_pct"),
        ({"share_pct": 1e-320}, "share_pct"),
        ({"share_pct": 33.33333}, "share_pct"),
    ]:
        for path in ("/accounts/lattice/grant", "/accounts/lattice/grant/preview"):
            status, out = http("PUT" if path.endswith("grant") else "POST", svc.api + path,
                               root, body)
            assert status == 400 and out.get("field") == field, (path, body, status, out)
            assert "0.001" in out["message"] or ">= 0" in out["message"], out
    assert snapshot(svc, root) == before
    # sensible grants still pass: whole hours, thousandths, zero
    for body in ({"grant_hours": 12.5}, {"grant_hours": 0.001}, {"grant_hours": 0},
                 {"share_pct": 33.333}):
        status, out = http("PUT", svc.api + "/accounts/astro/grant", root, body)
        assert status == 200, (body, out)
    versions = http("GET", svc.api + "/accounts/astro/grants", root)[1]["versions"]
    stored = [v.get("grant_hours") for v in versions[-4:]] + [versions[-1].get("share_pct")]
    assert 12.5 in stored and 0.001 in stored and 0.0 in stored and 33.333 in stored, versions
