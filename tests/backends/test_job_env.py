"""What every backend tells a job about itself (backends/base.py ``job_identity_env``): who
and which attempt it is and, on GPUs lent from a gang's reservation (a backfill or a lease,
docs/core.md), when they are due back — the job saves its progress by then."""

from __future__ import annotations

from dataclasses import replace

from jupyter_gpubudget.backends.base import Launch, due_env, job_identity_env
from jupyter_gpubudget.backends.slurm import SlurmBackend
from jupyter_gpubudget.launcher.policy import SERVICE_ENV

LAUNCH = Launch(workload="w1", attempt=3, user="ann", project="astro",
                command=["python", "train.py"],
                placement=[{"node": "n0", "gpu": 0, "kind": "gpu", "milli": 1000}])


def test_a_job_knows_who_it_is_and_nothing_is_due_on_its_own_gpus():
    assert job_identity_env(LAUNCH) == {"GPUBUDGET_WORKLOAD": "w1", "GPUBUDGET_PROJECT": "astro",
                                        "GPUBUDGET_USER": "ann", "GPUBUDGET_ATTEMPT": "3"}
    assert due_env(LAUNCH) == {}


def test_lent_gpus_are_due_at_a_utc_time():
    lent = replace(LAUNCH, due_at=1_800_000_000.0)
    assert due_env(lent) == {"GPUBUDGET_DUE_AT": "2027-01-15T08:00:00Z"}
    assert job_identity_env(lent)["GPUBUDGET_DUE_AT"] == "2027-01-15T08:00:00Z"
    # seconds are cut, never rounded up: a job that saves by then is in time
    assert due_env(replace(LAUNCH, due_at=1_800_000_000.9)) == {
        "GPUBUDGET_DUE_AT": "2027-01-15T08:00:00Z"}


def test_the_slurm_job_script_exports_the_due_time():
    """The script only (no Slurm needed): the real cluster's job prints it in
    tests/slurm/test_backend.py."""
    b = SlurmBackend()
    assert "GPUBUDGET_DUE_AT" not in b.job_script(LAUNCH)
    assert "export GPUBUDGET_DUE_AT=2027-01-15T08:00:00Z\n" in b.job_script(
        replace(LAUNCH, due_at=1_800_000_000.0))


def test_the_local_launcher_accepts_every_variable_the_service_sets():
    """The root launcher refuses a ``job_env`` key it does not know ("not a variable the
    service sets"): each one the backends send must be on its list."""
    assert set(job_identity_env(replace(LAUNCH, due_at=1.0))) <= SERVICE_ENV


def test_a_job_may_not_set_its_own_due_time():
    """The attack: a job spec's own ``env`` claiming a later due time (or none at all) is
    refused, naming the key; only the service sets it."""
    from jupyter_gpubudget.launcher.policy import env_problem

    for value in ("2099-01-01T00:00:00Z", ""):
        why = env_problem({"GPUBUDGET_DUE_AT": value})
        assert why is not None and why[0] == "env.GPUBUDGET_DUE_AT"
