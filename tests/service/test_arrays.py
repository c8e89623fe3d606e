"""Job arrays against the real service process and the local backend: an array of 20 with
``max_running: 3`` runs through with each task's index in its environment and never more than
3 tasks running (read from the ledger's record of each task's run); one task and the whole
array cancelled, by REST and by `gpubudget cancel`; `gpubudget jobs` shows an array as one row."""

from __future__ import annotations

from jupyter_gpubudget.cli import main
from tests.fixtures.hub import http
from tests.service.test_api import get_w, wait_for


def run(capsys, service, token, *argv):  # noqa: ANN001, ANN201
    rc = main([argv[0], f"--url={service.base}", f"--token={token}", *argv[1:]])
    out = capsys.readouterr()
    return rc, out.out, out.err


def most_at_once(runs: list[tuple[float, float]]) -> int:
    """The most runs that overlapped (an end at the moment of a start is not an overlap)."""
    edges = sorted([(e, -1) for _, e in runs] + [(s, 1) for s, _ in runs])
    n = top = 0
    for _, d in edges:
        n += d
        top = max(top, n)
    return top


def test_an_array_of_20_runs_at_most_3_at_once_with_its_index(service, tokens):
    bob = tokens["bob"]
    status, arr = http("POST", service.api + "/jobs", bob, {
        "command": "echo index=$GPUBUDGET_ARRAY_INDEX; sleep 0.3", "project": "lattice",
        "gpus": 0, "name": "sweep", "array": "0-19", "max_running": 3})
    assert status == 201, arr
    assert arr["array"] and len(arr["tasks"]) == 20 and arr["max_running"] == 3
    ids = [t["id"] for t in arr["tasks"]]
    assert ids == [f"{arr['id']}_{i}" for i in range(20)]

    def ended():  # noqa: ANN202
        ws = [get_w(service, bob, i) for i in ids]
        return ws if all(w["state"] == "done" for w in ws) else None

    ws = wait_for(ended, "the array's 20 tasks to finish", timeout=120)
    # CPU-only tasks: without the cap all 20 would start in one cycle
    assert most_at_once([(w["started_at"], w["ended_at"]) for w in ws]) <= 3
    for i, w in enumerate(ws):
        assert w["array_id"] == arr["id"] and w["array_index"] == i
        out = (service.dir / "jobs" / w["id"] / "1" / "output.log").read_text()
        assert out.strip() == f"index={i}"
    jobs = http("GET", service.api + "/jobs?state=done", bob)[1]["jobs"]
    row = next(j for j in jobs if j["id"] == arr["id"])
    assert row["array"] and row["counts"] == {"done": 20}
    assert not any(j["id"] in ids for j in jobs)  # one row, not 20


def test_cancel_one_task_then_the_whole_array(service, tokens):
    bob = tokens["bob"]
    status, arr = http("POST", service.api + "/jobs", bob, {
        "command": "sleep 60", "project": "lattice", "gpus": 0, "name": "long",
        "array": [0, 1, 2, 3, 4], "max_running": 2})
    assert status == 201, arr
    aid = arr["id"]
    wait_for(lambda: get_w(service, bob, f"{aid}_1")["state"] == "running", "two tasks running")
    status, out = http("DELETE", f"{service.api}/jobs/{aid}_4", bob)
    assert status == 200 and out["state"] == "cancelled"
    assert get_w(service, bob, f"{aid}_3")["state"] == "pending"  # the cap holds it
    status, out = http("DELETE", f"{service.api}/jobs/{aid}", bob)
    assert status == 200 and out["counts"] == {"cancelled": 5}, out
    # another user may not cancel it (nothing left to cancel, but the answer is a refusal)
    assert http("DELETE", f"{service.api}/jobs/{aid}", tokens["dave"])[0] == 403


def test_cli_submits_lists_and_cancels_an_array(tmp_path, capsys, service, tokens):
    bob = tokens["bob"]
    job = tmp_path / "array.yaml"
    job.write_text("command: sleep 60\nproject: lattice\ngpus: 0\nname: cli-array\n"
                   "array: 0-9\nmax_running: 2\n")
    rc, out, err = run(capsys, service, bob, "submit", str(job))
    assert rc == 0, err
    aid = out.split()[1]
    assert "array of 10 tasks" in out
    wait_for(lambda: get_w(service, bob, f"{aid}_1")["state"] == "running", "two tasks running")
    rc, out, _ = run(capsys, service, bob, "jobs")
    line = next(ln for ln in out.splitlines() if ln.startswith(aid))
    assert "2 running" in line and "8 pending" in line and "max 2 running" in line
    assert f"{aid}_0" not in out
    rc, out, err = run(capsys, service, bob, "cancel", f"{aid}_7")
    assert rc == 0, err
    assert get_w(service, bob, f"{aid}_7")["state"] == "cancelled"
    rc, out, err = run(capsys, service, bob, "cancel", aid)
    assert rc == 0, err
    states = {get_w(service, bob, f"{aid}_{i}")["state"] for i in range(10)}
    assert states == {"cancelled"}


def test_a_bad_array_is_refused_naming_the_field_and_nothing_is_queued(service, tokens):
    bob = tokens["bob"]
    before = http("GET", service.api + "/jobs", bob)[1]["jobs"]
    for body, field in [({"array": "5-2"}, "array"), ({"array": "0-20000"}, "array"),
                        ({"array": [1, 1]}, "array"), ({"max_running": 2}, "max_running"),
                        ({"array": "0-3", "max_running": 0}, "max_running")]:
        status, out = http("POST", service.api + "/jobs", bob, {
            "command": "true", "project": "lattice", "gpus": 0, **body})
        assert status == 400 and out["field"] == field, (body, out)
    assert [j["id"] for j in http("GET", service.api + "/jobs", bob)[1]["jobs"]] == \
        [j["id"] for j in before]
