"""Security review: ``/jobs`` accepted what ``/sessions`` refused (gpus 15/17/1024 on 14 GPUs, a
9-GPU ``single_node`` job, slice ``9g.999gb``, ``1g.5gb`` on H100, an unknown ``gpu_model``,
``mps:250:10^24``, env keys like ``A=B`` or with NUL): all 201, then pending forever. Both
paths now use one validator against the inventory: 400 at submission naming the field. And
``user_options`` ``gpus: 2.9`` is refused, not truncated to 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from tornado import web

from jupyter_gpubudget.hub.spawner import normalise_slice
from tests.fixtures.hub import http

DEMO_INVENTORY = (Path(__file__).resolve().parents[2] / "examples" /
                  "inventory-demo.yaml").read_text()  # 16 H100s, 2 of them MIG: 14 whole

REFUSED = [
    ({"gpus": 15}, "gpus"),
    ({"gpus": 17}, "gpus"),
    ({"gpus": 1024}, "gpus"),
    ({"gpus": 9, "single_node": True}, "gpus"),
    ({"slice": "9g.999gb"}, "slice"),
    ({"slice": "1g.5gb"}, "slice"),
    ({"gpus": 1, "gpu_model": "B200"}, "gpu_model"),
    ({"slice": "mps:250:" + "1" + "0" * 24}, "slice"),
    ({"slice": "mps:250:200000"}, "slice"),
]


def test_jobs_and_sessions_refuse_what_no_hardware_could_hold(service_factory, tokens):
    svc = service_factory(inventory=DEMO_INVENTORY)
    bob, root = tokens["bob"], tokens["root"]
    for extra, field in REFUSED:
        status, out = http("POST", svc.api + "/jobs", bob,
                           {"command": "true", "project": "lattice", **extra})
        assert status == 400 and out["field"] == field, ("job", extra, status, out)
        if "single_node" in extra:
            continue  # not a session field
        status, out = http("POST", svc.api + "/sessions", root,
                           {"user": "bob", "project": "lattice", **extra})
        assert status == 400 and out["field"] == field, ("session", extra, status, out)
    for env, field in (({"A=B": "x"}, "env.A=B"), ({"A\u0000": "x"}, "env"),
                       ({"A": "x\u0000y"}, "env.A")):
        status, out = http("POST", svc.api + "/jobs", bob,
                           {"command": "true", "project": "lattice", "env": env})
        assert status == 400 and out["field"] == field, (env, status, out)
    assert http("GET", svc.api + "/jobs", bob)[1]["jobs"] == []
    # what the hardware offers is still accepted
    for extra in ({"gpus": 14}, {"gpus": 8, "single_node": True}, {"slice": "1g.10gb"},
                  {"gpus": 1, "gpu_model": "H100-80GB"}, {"slice": "mps:250:4096"}):
        status, out = http("POST", svc.api + "/jobs", bob,
                           {"command": "true", "project": "lattice", **extra})
        assert status == 201, (extra, out)
        http("DELETE", f"{svc.api}/jobs/{out['id']}", bob)


@pytest.mark.parametrize("gpus", [2.9, "2.9", "two", True, -1.5, "1e3"])
def test_user_options_gpus_must_be_a_whole_number(gpus):
    with pytest.raises(web.HTTPError) as e:
        normalise_slice({"gpus": gpus})
    assert e.value.status_code == 400 and "gpus" in e.value.log_message


def test_user_options_whole_numbers_pass_unchanged():
    assert normalise_slice({"gpus": 2}) == {"gpus": 2}
    assert normalise_slice({"gpus": "3"}) == {"gpus": 3}
    assert normalise_slice({"gpus": 4.0}) == {"gpus": 4}
