"""`gpubudget submit / jobs / cancel` against the real service."""

from __future__ import annotations

from jupyter_gpubudget.cli import main
from tests.fixtures.hub import http


def run(capsys, service, token, *argv):  # noqa: ANN001, ANN201
    rc = main([argv[0], f"--url={service.base}", f"--token={token}", *argv[1:]])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_submit_jobs_cancel(tmp_path, capsys, service, tokens):
    job = tmp_path / "job.yaml"
    job.write_text("command: sleep 30\nproject: lattice\ngpus: 1\nmin_runtime: 10m\n"
                   "resumable: true\nname: cli-job\n")
    rc, out, err = run(capsys, service, tokens["bob"], "submit", str(job))
    assert rc == 0, err
    wid = out.split()[1]
    rc, out, _ = run(capsys, service, tokens["bob"], "jobs")
    assert rc == 0 and wid in out and "cli-job" in out
    rc, out, err = run(capsys, service, tokens["bob"], "cancel", wid)
    assert rc == 0, err
    assert http("GET", f"{service.api}/workloads/{wid}", tokens["bob"])[1]["state"] == "cancelled"


def test_bad_job_file_names_line_and_field_and_submits_nothing(tmp_path, capsys, service, tokens):
    def ids() -> list[tuple[str, str]]:  # (the texts like "1 s ago" change as time goes by)
        return [(j["id"], j["state"]) for j in
                http("GET", service.api + "/jobs", tokens["bob"])[1]["jobs"]]

    before = ids()
    job = tmp_path / "bad.yaml"
    job.write_text("command: sleep 1\nproject: lattice\ngpus: lots\n")
    rc, _, err = run(capsys, service, tokens["bob"], "submit", str(job))
    assert rc == 2 and "bad.yaml:3" in err and "gpus" in err
    assert ids() == before


def test_refusal_is_reported(tmp_path, capsys, service, tokens):
    job = tmp_path / "job.yaml"
    job.write_text("command: 'true'\nproject: genomics\n")
    rc, _, err = run(capsys, service, tokens["bob"], "submit", str(job))
    assert rc == 1 and "403" in err and "genomics" in err


def test_logs_prints_the_output_and_follows_a_running_job(capsys, service, tokens, tmp_path):
    bob = tokens["bob"]
    job = tmp_path / "job.yaml"
    job.write_text("command: 'for i in 1 2 3 4; do echo line $i; sleep 0.4; done; echo fin'\n"
                   "project: lattice\ngpus: 0\nname: cli-logs\n")
    rc, out, err = run(capsys, service, bob, "submit", str(job))
    assert rc == 0, err
    wid = out.split()[1]
    rc, out, err = run(capsys, service, bob, "logs", wid, "--follow", "--interval=0.1")
    assert rc == 0, err
    assert out == "line 1\nline 2\nline 3\nline 4\nfin\n"  # all of it, once, in order
    assert f"job {wid} done" in err
    rc, out, err = run(capsys, service, bob, "logs", wid)  # again, without following
    assert rc == 0 and out == "line 1\nline 2\nline 3\nline 4\nfin\n"
    rc, _, err = run(capsys, service, tokens["dave"], "logs", wid)  # another user's job
    assert rc == 1 and "403" in err
    rc, _, err = run(capsys, service, bob, "logs", "no-such-job")
    assert rc == 1 and "404" in err


def test_submit_dry_run_submits_nothing_and_says_the_cost(tmp_path, capsys, service, tokens):
    """Without off-peak prices (the test service sets none): the predicted start and what the
    job's time limit costs; a bad job file is still refused before anything is asked."""
    bob = tokens["bob"]
    before = [j["id"] for j in http("GET", service.api + "/jobs", bob)[1]["jobs"]]
    job = tmp_path / "job.yaml"
    job.write_text("command: 'true'\nproject: lattice\ngpus: 1\ntime_limit: 90m\n")
    rc, out, err = run(capsys, service, bob, "submit", "--dry-run", str(job))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("dry run: nothing submitted. lattice: ")
    assert lines[1:] == ["its 1.5 h cost 1.50 GPU-h"]
    job.write_text("command: 'true'\nproject: lattice\nstart: tonight\n")
    rc, _, err = run(capsys, service, bob, "submit", "--dry-run", str(job))
    assert rc == 2 and "job.yaml:3" in err and "start" in err
    assert [j["id"] for j in http("GET", service.api + "/jobs", bob)[1]["jobs"]] == before
