"""SlurmBackend against the real test cluster, without a hub: the inventory and health from
scontrol, jobs submitted as their user with the core's placement, found again by a fresh
backend (a restarted service), stopped with scancel, their end read from sacct; the core's
drain written back to Slurm; usage compared with sacct."""

from __future__ import annotations

import os
import pwd
import threading
import time
import uuid
from pathlib import Path

import pytest

from jupyter_gpubudget.backends.base import Launch
from jupyter_gpubudget.backends.slurm import SlurmBackend, SlurmError

SUDO_KEEP_CONF = ["sudo", "-n", "-u", "{user}", "--preserve-env=SLURM_CONF", "--"]


def make_backend(**kw) -> SlurmBackend:
    kw = {"user_command_prefix": SUDO_KEEP_CONF, "gpu_models": {"h100": "H100-80GB"},
          "watch_interval": 0.5, "stop_grace": 30, "usage_threshold": 5.0, **kw}
    return SlurmBackend(**kw)


@pytest.fixture(scope="module")
def backend(slurm_accounts):
    return make_backend()


def wait(pred, timeout: float = 30, what: str = ""):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}")


def launch(b: SlurmBackend, command: str, placement: list[dict], user: str = "gpb-ben",
           project: str = "astro", **kw) -> Launch:
    la = Launch(workload=uuid.uuid4().hex[:12], attempt=1, user=user, project=project,
                command=["/bin/sh", "-c", command], placement=placement,
                env={"JOB_GREETING": "hello world"}, time_limit=600, **kw)
    b.launch(la)
    return la


def output_of(la: Launch, job_id: str) -> str:
    home = Path(pwd.getpwnam(la.user).pw_dir)
    return (home / f"gpubudget-gpubudget.{la.workload}.{la.attempt}-{job_id}.out").read_text()


def test_a_job_on_lent_gpus_is_told_when_they_are_due(backend):
    """A backfill or a lease (``Launch.due_at``) runs with ``GPUBUDGET_DUE_AT`` in its
    environment on the real cluster; a job on GPUs of its own has none."""
    due = launch(backend, 'echo "due=${GPUBUDGET_DUE_AT:-none}"',
                 [{"node": "gpu2", "gpu": 0, "kind": "gpu", "milli": 1000}],
                 due_at=1_800_000_000.0)
    own = launch(backend, 'echo "due=${GPUBUDGET_DUE_AT:-none}"',
                 [{"node": "gpu2", "gpu": 1, "kind": "gpu", "milli": 1000}])
    for la, want in ((due, "due=2027-01-15T08:00:00Z"), (own, "due=none")):
        wait(lambda la=la: (s := backend.status(la.workload, 1)) and not s.alive, 30, "end")
        rec = backend.accounting([f"gpubudget.{la.workload}.1"])[0]
        assert output_of(la, rec.job_id).splitlines()[0] == want


def test_inventory_and_health_from_scontrol(backend):
    inv = backend.discover_inventory()
    assert inv.source == "slurm"
    assert [(n.name, [(g.model, g.mig) for g in n.gpus]) for n in inv.nodes] == [
        ("gpu1", [("H100-80GB", False)] * 2), ("gpu2", [("H100-80GB", False)] * 2)]
    assert inv.nodes[0].cpu_milli == 4000 and inv.nodes[0].memory_mib == 8000
    assert backend.node_health() == {}
    assert backend.gpu_type("gpu1", 1) == "h100"


def test_job_runs_as_its_user_with_the_placement_and_a_clean_environment(backend, slurm_accounts):
    os.environ["GPUBUDGET_SERVICE_SECRET"] = "must-not-leak"
    try:
        la = launch(backend, 'echo "$(id -un) $GPUBUDGET_WORKLOAD $CUDA_VISIBLE_DEVICES '
                             '$SLURM_JOB_NODELIST [$JOB_GREETING]"; env',
                    [{"node": "gpu2", "gpu": 1, "kind": "gpu", "milli": 1000}])
    finally:
        del os.environ["GPUBUDGET_SERVICE_SECRET"]
    st = wait(lambda: (s := backend.status(la.workload, 1)) and not s.alive and s, 30,
              "the job ends")
    assert st.exit_code == 0 and st.ended_at is not None
    rec = backend.accounting([f"gpubudget.{la.workload}.1"])[0]
    assert rec.user == "gpb-ben" and rec.nodes == "gpu2" and rec.state == "COMPLETED"
    assert "gres/gpu:h100=1" in rec.gres
    out = output_of(la, rec.job_id)
    assert out.splitlines()[0] == f"gpb-ben {la.workload} 0 gpu2 [hello world]"
    assert "must-not-leak" not in out and "JUPYTERHUB" not in out
    acct = slurm_accounts.run("sacct", "-X", "-n", "-P", "-j", rec.job_id,
                              "--format=Account,Comment")
    assert acct.strip().startswith("astro|")


def test_a_gangs_mig_instances_are_bound_one_per_task(slurm_accounts):
    """Policy ``gang_on_mig``: a CUDA process sees one MIG instance, so on the node where a gang
    holds MIG instances Slurm binds each task to its own (``--gpu-bind=per_task:1``), while the
    tasks on the gang's node of whole GPUs see both. The test cluster has no MIG GRES: the
    instances' profile is mapped onto the nodes' ``h100`` type (``SlurmBackend.mig_types``)."""
    b = make_backend(mig_types={"7g.80gb": "h100"})
    placement = [{"node": "gpu1", "gpu": i, "kind": "gpu", "milli": 1000} for i in (0, 1)] + [
        {"node": "gpu2", "gpu": i, "kind": "mig", "milli": 1000, "profile": "7g.80gb",
         "mig_start": 0} for i in (0, 1)]
    la = launch(b, "srun --het-group=0,1 sh -c "
                   "'echo rank $SLURM_PROCID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'", placement)
    st = wait(lambda: (s := b.status(la.workload, 1)) and not s.alive and s, 60, "the gang ends")
    assert st.exit_code == 0
    rec = b.accounting([f"gpubudget.{la.workload}.1"])[0]
    lines = sorted(x.split()[1:] for x in output_of(la, rec.job_id).splitlines()
                   if x.startswith("rank "))
    assert lines == [["0", "gpu1", "0,1"], ["1", "gpu1", "0,1"], ["2", "gpu2", "0"],
                     ["3", "gpu2", "1"]]


def test_a_restarted_backend_finds_stops_and_settles_its_job(backend):
    la = launch(backend, "sleep 300", [{"node": "gpu1", "gpu": 0, "kind": "gpu", "milli": 1000}])
    wait(lambda: any(j.state == "RUNNING" for j in backend.queue(fresh=True)
                     if j.name == f"gpubudget.{la.workload}.1"), 30, "the job runs")
    fresh = make_backend()  # what a restarted service has: no memory of the launch
    assert fresh.status(la.workload, 1).alive
    assert (la.workload, 1) in fresh.orphans(set())
    assert (la.workload, 1) not in fresh.orphans({(la.workload, 1)})
    t0 = time.time()
    st = fresh.stop(la.workload, 1)
    assert not st.alive and st.exit_code == 143  # SIGTERM from scancel
    assert st.ended_at is not None and t0 - 2 <= st.ended_at <= time.time() + 1
    assert not fresh.status(la.workload, 1).alive
    assert fresh.accounting([f"gpubudget.{la.workload}.1"])[0].state == "CANCELLED"


def test_exit_code_and_the_end_notice(backend):
    ended = threading.Event()
    backend.on_exit = ended.set
    try:
        la = launch(backend, "exit 3", [{"node": "gpu1", "gpu": -1, "kind": "cpu", "milli": 0}])
        assert ended.wait(30), "the watcher noticed the job ending"
    finally:
        backend.on_exit = None
    st = wait(lambda: (s := backend.status(la.workload, 1)) and not s.alive and s, 30)
    assert st.exit_code == 3


def test_a_refused_submission_is_a_clear_error(backend):
    with pytest.raises(SlurmError, match="(?i)account"):
        launch(backend, "true", [{"node": "gpu1", "gpu": 0, "kind": "gpu"}], project="nosuch")
    with pytest.raises(SlurmError, match="no Unix account"):
        launch(backend, "true", [{"node": "gpu1", "gpu": 0, "kind": "gpu"}], user="nobody-x")


def test_drain_written_back_and_only_our_own_drains_undone(backend, slurm_accounts):
    c = slurm_accounts
    try:
        backend.drain_node("gpu1", "slurm: test reason")
        state, reason = c.node_state("gpu1")
        assert "DRAIN" in state and reason.startswith("gpubudget: slurm: test reason")
        backend._nodes = None
        assert "gpu1" in backend.node_health()
        backend.undrain_node("gpu1")
        assert "DRAIN" not in c.node_state("gpu1")[0]
        c.run("scontrol", "update", "nodename=gpu2", "state=drain", "reason=disk repair")
        backend._nodes = None
        backend.drain_node("gpu2", "ours")  # already drained: the admin's reason stays
        assert c.node_state("gpu2")[1].startswith("disk repair")
        backend.undrain_node("gpu2")  # not our drain: left alone
        assert "DRAIN" in c.node_state("gpu2")[0]
    finally:
        for n in ("gpu1", "gpu2"):
            c.run("scontrol", "update", f"nodename={n}", "state=resume", check=False)


def test_usage_reconciled_with_sacct(backend):
    la = launch(backend, "sleep 2", [{"node": "gpu2", "gpu": 0, "kind": "gpu", "milli": 1000}])
    wait(lambda: not backend.status(la.workload, 1).alive, 30, "the job ends")
    rec = backend.accounting([f"gpubudget.{la.workload}.1"])[0]
    assert rec.start and rec.end and 1 <= rec.end - rec.start <= 5
    good = [(la.workload, 1, rec.start + 1, rec.end - 1, "slurm")]
    assert backend.reconcile_usage(good) == []
    shifted = [(la.workload, 1, rec.start, rec.end + 100, "slurm")]
    (m,) = backend.reconcile_usage(shifted)
    assert m["workload"] == la.workload and m["slurm_job"] == rec.job_id
    assert m["difference_s"] == pytest.approx(100)
    missing = [("nosuchworkload", 1, 0.0, 10.0, "slurm"), ("a-session", 1, 0.0, 10.0, "hub")]
    (m,) = backend.reconcile_usage(missing)  # a batch job must be in Slurm; a session may not
    assert m["workload"] == "nosuchworkload" and m["why"] == "no Slurm job found"
