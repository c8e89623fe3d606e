"""What a submission is checked for before anything is queued: a gang no single cluster can
hold, names with a trailing newline; and `gpubudget cancel` sending the id as one path
segment."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from jupyter_gpubudget.cli import main
from jupyter_gpubudget.core.inventory import load_inventory
from jupyter_gpubudget.core.model import SliceRequest
from jupyter_gpubudget.launcher.policy import WORKLOAD_ID
from jupyter_gpubudget.service.base import ApiError
from jupyter_gpubudget.service.resume import pop_resume_fields
from jupyter_gpubudget.service.validate import Invalid, check_offered, parse_job, parse_session

TWO_CLUSTERS = """\
nodes:
  - {name: a1, model: H100-80GB, gpus: 2, cluster: east}
  - {name: b1, model: H100-80GB, gpus: 2, cluster: west}
"""


def test_a_gang_larger_than_any_one_cluster_is_refused_at_submission():
    """2 + 2 GPUs on two clusters: a 4-GPU gang would wait forever (a workload never spans
    clusters), so it is refused, naming the field and each cluster's reason."""
    inv = load_inventory(TWO_CLUSTERS)
    with pytest.raises(Invalid) as e:
        check_offered(inv, SliceRequest.whole(4))
    assert e.value.field == "gpus"
    assert "no single cluster" in e.value.message
    assert "east" in e.value.message and "west" in e.value.message
    check_offered(inv, SliceRequest.whole(2))  # fits on either
    with pytest.raises(Invalid):
        check_offered(inv, SliceRequest.whole(3))


JOB = {"command": ["/bin/true"], "project": "lattice", "gpus": 1}


def test_a_cluster_name_with_a_trailing_newline_is_refused():
    with pytest.raises(Invalid) as e:
        parse_job({**JOB, "cluster": "east\n"})
    assert e.value.field == "cluster"


def test_session_names_and_resume_ids_with_a_trailing_newline_are_refused():
    for field in ("user", "project"):
        with pytest.raises(Invalid) as e:
            parse_session({"user": "ws", "project": "lattice", field: "ws\n"})
        assert e.value.field == field
    with pytest.raises(ApiError) as e2:
        pop_resume_fields({"resumes": "abc\n"})
    assert e2.value.field == "resumes"
    assert WORKLOAD_ID.fullmatch("w1") and not WORKLOAD_ID.fullmatch("w1\n")


class _Recorder(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_DELETE(self) -> None:  # noqa: N802
        self.paths.append(self.path)
        data = json.dumps({"id": "x", "state": "cancelled"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a) -> None:  # noqa: ANN002
        pass


def test_cancel_sends_the_id_as_one_encoded_path_segment(capsys):
    """An id with '/', '..' or '?' stays one segment of /jobs/{id} (as `logs` does): it
    cannot reach another route or drop into the query."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/services/gpubudget"
        rc = main(["cancel", f"--url={url}", "--token=t", "x/../sessions/y?z"])
    finally:
        server.shutdown()
    assert rc == 0, capsys.readouterr().err
    assert _Recorder.paths == ["/services/gpubudget/api/v1/jobs/x%2F..%2Fsessions%2Fy%3Fz"]
