"""Trace loaders: good input parses; bad rows are refused naming file, line and column."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.core.model import SliceRequest
from jupyter_gpubudget.core.yamlnodes import ConfigError
from jupyter_gpubudget.sim.traces import (
    TraceError,
    assign_projects,
    detect_format,
    load_trace,
    parse_itp,
    parse_native,
    parse_openb_nodes,
    parse_openb_pods,
    parse_slice,
    parse_trace,
)

NATIVE = """\
id,submit,duration,slice,project,user,kind,min_runtime,resumable
nb-1,0,2h,1,lattice,bob,interactive,30m,false
job-7,600,86400,8,astro,dave,batch,1h,true
dbg,1h,90,mps:250:8192,lattice,bob,debug,,
mig,2h,10m,mig:1g.18gb,astro,dave,interactive,0,
"""


def test_native_parses_all_columns() -> None:
    t = parse_native(NATIVE, "t.csv")
    assert [j.id for j in t.jobs] == ["nb-1", "job-7", "dbg", "mig"]
    nb, job, dbg, mig = t.jobs
    assert nb.duration == 7200 and nb.kind == "interactive" and nb.min_runtime == 1800
    assert nb.resumable is False and nb.request == SliceRequest.whole(1)
    assert job.request == SliceRequest.whole(8) and job.resumable is True
    assert dbg.submit == 3600 and dbg.request == SliceRequest.mps(250, 8192)
    assert dbg.resumable is True  # default for non-interactive
    assert mig.request == SliceRequest.mig("1g.18gb") and mig.duration == 600


def test_native_with_gpus_column_and_defaults() -> None:
    t = parse_native("submit,duration,gpus\n5,10,0\n0,20,2\n", "t.csv")
    assert [j.submit for j in t.jobs] == [0, 5]  # sorted by submit
    assert t.jobs[1].request.kind == "cpu"
    assert t.jobs[0].kind == "batch" and t.jobs[0].project == ""


@pytest.mark.parametrize("text, line, column, words", [
    ("submit,duration,gpus\n0,10,1\nx,10,1\n", 3, "submit", "expected seconds"),
    ("submit,duration,gpus\n0,-5,1\n", 2, "duration", "duration"),
    ("submit,duration,gpus\n0,0,1\n", 2, "duration", "longer than zero"),
    ("submit,duration,gpus\n0,10,1.5\n", 2, "gpus", "whole number"),
    ("submit,duration,gpus\n0,10,-1\n", 2, "gpus", "≥ 0"),
    ("submit,duration,gpus\n0,10\n", 2, "", "expected 3 values"),
    ("submit,duration,slice\n0,10,mps:2000\n", 2, "slice", "1..1000"),
    ("submit,duration,slice\n0,10,tpu:4\n", 2, "slice", "expected whole GPUs"),
    ("submit,duration,slice\n0,10,\n", 2, "slice", "missing value"),
    ("submit,duration,gpus,kind\n0,10,1,notebook\n", 2, "kind", "interactive"),
    ("submit,duration,gpus,resumable\n0,10,1,maybe\n", 2, "resumable", "true or false"),
    ("id,submit,duration,gpus\na,0,10,1\na,1,10,1\n", 3, "id", "also on line 2"),
    ("submit,duration,gpus,min_runtime\n0,10,1,soon\n", 2, "min_runtime", "duration"),
    ("submit,duration,gpus,project\n0,10,1,bad name\n", 2, "project", "letters"),
    ("submit,gpus\n0,1\n", 1, "duration", "missing required column"),
    ("submit,duration\n0,1\n", 1, "gpus", "one of the columns"),
    ("submit,duration,gpus,colour\n0,1,1,red\n", 1, "colour", "unknown column"),
    ("submit,duration,gpus,gpus\n0,1,1,1\n", 1, "gpus", "duplicate column"),
    ("", 1, "", "empty"),
])
def test_native_malformed_rows_name_line_and_column(text: str, line: int, column: str,
                                                     words: str) -> None:
    with pytest.raises(TraceError) as e:
        parse_native(text, "bad.csv")
    err = e.value
    assert isinstance(err, ConfigError)
    assert err.line == line and err.path == column and err.source == "bad.csv"
    assert words in err.message
    assert f"bad.csv:{line}" in str(err)


def test_blank_lines_keep_line_numbers() -> None:
    with pytest.raises(TraceError) as e:
        parse_native("submit,duration,gpus\n0,1,1\n\n\n0,x,1\n", "b.csv")
    assert e.value.line == 5 and e.value.path == "duration"


def test_itp_parses_and_rejects() -> None:
    t = parse_itp("job_id,submission_time,duration,num_gpu\na,10,100,4\nb,0,50,1\n", "itp.csv")
    assert [j.id for j in t.jobs] == ["b", "a"]
    assert t.jobs[1].request == SliceRequest.whole(4) and t.jobs[1].resumable
    for text, line, col in [
        ("job_id,submission_time,duration,num_gpu\na,10,100,0\n", 2, "num_gpu"),
        ("job_id,submission_time,duration,num_gpu\na,10,100,1\nb,x,1,1\n", 3, "submission_time"),
        ("job_id,submission_time,duration,num_gpu\na,10,0,1\n", 2, "duration"),
        ("job_id,submission_time,duration,num_gpu\na,10,5,1\na,11,5,1\n", 3, "job_id"),
        ("job_id,submission_time,num_gpu\na,10,1\n", 1, "duration"),
    ]:
        with pytest.raises(TraceError) as e:
            parse_itp(text, "itp.csv")
        assert (e.value.line, e.value.path) == (line, col), text


def test_openb_pods_and_nodes() -> None:
    pods = parse_openb_pods(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        "p0,12000,16384,1,1000,,LS,Running,0,100,0\n"
        "p1,6000,12288,1,460,V100M16|V100M32,LS,Running,5,50,6\n"
        "p2,4000,1024,0,0,,BE,Running,7,70,7\n"
        "p3,88000,1024,8,1000,,BE,Running,7,70,7\n", "pods.csv")
    assert pods[1].request() == SliceRequest.mps(460, cpu_milli=6000, memory_mib=12288,
                                                 gpu_model="V100M16|V100M32")
    assert pods[2].request().kind == "cpu"
    assert pods[3].request() == SliceRequest.whole(8, single_node=True, cpu_milli=88000,
                                                   memory_mib=1024)
    assert pods[1].gpu_request_milli == 460 and pods[3].gpu_request_milli == 8000
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
    for row, col in [("p,1,1,1,1500", "gpu_milli"), ("p,1,1,2,500", "gpu_milli"),
                     ("p,x,1,1,100", "cpu_milli"), (",1,1,1,100", "name")]:
        with pytest.raises(TraceError) as e:
            parse_openb_pods(head + "p0,1,1,1,100\n" + row + "\n", "pods.csv")
        assert (e.value.line, e.value.path) == (3, col), row
    nodes = parse_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\n",
                              "nodes.csv")
    assert nodes[0].gpus == 2 and nodes[0].model == "P100"
    with pytest.raises(TraceError) as e:
        parse_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,P\nn0,1,1,2,P\n", "n.csv")
    assert (e.value.line, e.value.path) == (3, "sn")


def test_detect_format() -> None:
    assert detect_format("job_id,submission_time,duration,num_gpu\n") == "itp"
    assert detect_format("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n") == "openb"
    assert detect_format("submit,duration,gpus\n") == "native"
    t = parse_trace("\ufeffjob_id,submission_time,duration,num_gpu\na,1,2,1\n", "x")
    assert t.format == "itp"


def test_unknown_header_lists_the_formats_and_their_columns() -> None:
    with pytest.raises(TraceError) as e:
        parse_trace("when,how_long,cards\n1,2,3\n", "mystery.csv")
    msg = str(e.value)
    assert e.value.line == 1 and "mystery.csv" in msg
    assert "matches no known trace format (columns: cards, how_long, when)" in msg
    for fmt in ("native: submit, duration", "itp: job_id, submission_time, duration, num_gpu",
                "openb: name, cpu_milli, memory_mib, num_gpu, gpu_milli"):
        assert fmt in msg


def test_openb_pod_list_without_times_points_to_placement_repro() -> None:
    with pytest.raises(TraceError) as e:
        parse_trace("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,500,\n",
                    "pods.csv")
    assert "use --placement-repro" in str(e.value)
    assert "creation_time and deletion_time" in str(e.value)


def test_native_checkpoint_interval_and_command_columns() -> None:
    t = parse_native("submit,duration,gpus,checkpoint_interval,command\n"
                     "0,1h,1,10m,train.py\n5,1h,1,,\n", "c.csv")
    assert (t.jobs[0].checkpoint_interval, t.jobs[0].command) == (600.0, "train.py")
    assert (t.jobs[1].checkpoint_interval, t.jobs[1].command) == (None, "")


def test_parse_slice() -> None:
    assert parse_slice("cpu").kind == "cpu"
    assert parse_slice("gpu:4") == SliceRequest.whole(4)
    with pytest.raises(ValueError):
        parse_slice("mps:1:2:3")


def test_missing_file_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TraceError) as e:
        load_trace(tmp_path / "nope.csv")
    assert "no such trace file" in str(e.value)


BUDGETS = """\
accounts:
  big: {grant: 300}
  small: {grant: 100}
"""


def test_assign_projects_is_deterministic_and_follows_grants() -> None:
    b = load_budgets(BUDGETS, "b.yaml")
    rows = "".join(f"j{i},{i},10,1\n" for i in range(4000))
    t = parse_itp("job_id,submission_time,duration,num_gpu\n" + rows, "itp.csv")
    a1 = assign_projects(t, b.accounts)
    a2 = assign_projects(t, b.accounts)
    assert [j.project for j in a1.jobs] == [j.project for j in a2.jobs]
    share = sum(j.project == "big" for j in a1.jobs) / len(a1.jobs)
    assert 0.72 < share < 0.78
    assert all(j.user.startswith(j.project + "-u") for j in a1.jobs)


def test_assign_projects_refuses_unknown_project() -> None:
    b = load_budgets(BUDGETS, "b.yaml")
    t = parse_native("submit,duration,gpus,project\n0,10,1,nowhere\n", "t.csv")
    with pytest.raises(TraceError, match="not a project"):
        assign_projects(t, b.accounts)


def test_shared_itp_traces_load(shared_traces) -> None:  # type: ignore[no-untyped-def]
    t = load_trace(shared_traces / "itp" / "cluster10.csv")
    assert t.format == "itp" and len(t) >= 259
    assert all(j.request.gpus >= 1 for j in t.jobs)
