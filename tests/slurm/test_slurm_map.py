"""The pure Slurm mapping (no cluster needed): placement -> sbatch arguments (a table,
including MIG GRES and gangs), scontrol output -> inventory and health, squeue/sacct parsing,
usage reconciliation, and the budgets tree -> sacctmgr plan."""

from __future__ import annotations

import pytest

from jupyter_gpubudget.backends.slurm_map import (
    Interval,
    JobRecord,
    SlurmMapError,
    account_plan,
    exit_status,
    inventory_from_nodes,
    job_name,
    job_time,
    node_health,
    parse_gres,
    parse_job_name,
    parse_nodes,
    parse_sacct,
    parse_sacctmgr_accounts,
    parse_sacctmgr_users,
    parse_squeue,
    sbatch_args,
    slurm_time,
    usage_mismatches,
)
from jupyter_gpubudget.core.accounts import load_budgets


def g(node: str, gpu: int, **kw) -> dict:
    return {"node": node, "gpu": gpu, "kind": "gpu", "milli": 1000, **kw}


TYPES = {("a", 0): "h100", ("a", 1): "h100", ("b", 0): "h100", ("b", 1): "h100",
         ("m", 0): "a100", ("m", 1): "h100"}
MIG = {"1g.18gb": "nvidia_h200_1g.18gb"}
HEAD = ["--parsable", "--job-name=gpubudget.w1.1", "--no-requeue", "--comment=c"]
COMMON = ["--partition=gpubudget", "--account=lattice", "--time=0-02:00:00"]

# (case, placement, expected arguments after HEAD)
TABLE = [
    ("one whole GPU, typed", [g("a", 0)],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1", "--gres=gpu:h100:1"]),
    ("two GPUs on one node: one task per GPU", [g("a", 0), g("a", 1)],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=2", "--gres=gpu:h100:2"]),
    ("gang over two nodes, same GRES per node: one component",
     [g("a", 0), g("a", 1), g("b", 0), g("b", 1)],
     COMMON + ["--nodes=2", "--nodelist=a,b", "--ntasks-per-node=2", "--gres=gpu:h100:2"]),
    ("gang with unequal GPUs per node: a heterogeneous job",
     [g("a", 1), g("b", 0), g("b", 1)],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1", "--gres=gpu:h100:1", ":"]
     + COMMON + ["--nodes=1", "--nodelist=b", "--ntasks-per-node=2", "--gres=gpu:h100:2"]),
    ("MIG profile mapped to the site's GRES type",
     [{"node": "a", "gpu": 3, "kind": "mig", "milli": 143, "profile": "1g.18gb",
       "mig_start": 2}],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1",
               "--gres=gpu:nvidia_h200_1g.18gb:1"]),
    ("MIG profile without a mapping: the profile is the GRES type",
     [{"node": "a", "gpu": 3, "kind": "mig", "milli": 429, "profile": "3g.71gb",
       "mig_start": 4}],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1", "--gres=gpu:3g.71gb:1"]),
    ("MIG gang: two instances on two nodes",
     [{"node": "a", "gpu": 3, "kind": "mig", "profile": "1g.18gb"},
      {"node": "b", "gpu": 0, "kind": "mig", "profile": "1g.18gb"}],
     COMMON + ["--nodes=2", "--nodelist=a,b", "--ntasks-per-node=1",
               "--gres=gpu:nvidia_h200_1g.18gb:1"]),
    ("gang with full-size MIG instances beside whole GPUs (policy gang_on_mig): a "
     "heterogeneous job, the MIG-mode node a component with its own GRES",
     [g("a", 0), g("a", 1), {"node": "b", "gpu": 0, "kind": "mig", "milli": 1000,
                             "profile": "7g.141gb", "mig_start": 0}],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=2", "--gres=gpu:h100:2", ":"]
     + COMMON + ["--nodes=1", "--nodelist=b", "--ntasks-per-node=1", "--gres=gpu:7g.141gb:1"]),
    ("gang with two full-size MIG instances on a node: a task bound to each (a CUDA process "
     "sees one MIG instance); the node of whole GPUs unbound",
     [g("a", 0), g("a", 1)] + [{"node": "b", "gpu": i, "kind": "mig", "milli": 1000,
                                "profile": "7g.141gb", "mig_start": 0} for i in (0, 1)],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=2", "--gres=gpu:h100:2", ":"]
     + COMMON + ["--nodes=1", "--nodelist=b", "--ntasks-per-node=2", "--gres=gpu:7g.141gb:2",
                 "--gpu-bind=per_task:1"]),
    ("two MIG instances of one workload on one node: not a gang across nodes, unbound",
     [{"node": "b", "gpu": i, "kind": "mig", "milli": 429, "profile": "3g.71gb",
       "mig_start": 0} for i in (0, 1)],
     COMMON + ["--nodes=1", "--nodelist=b", "--ntasks-per-node=2", "--gres=gpu:3g.71gb:2"]),
    ("MPS share as percent of a GPU", [{"node": "a", "gpu": 0, "kind": "mps", "milli": 250}],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1", "--gres=mps:25"]),
    ("CPU only: the node, no GRES", [{"node": "a", "gpu": -1, "kind": "cpu", "milli": 0}],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=1"]),
    ("a node with two GPU types: each typed", [g("m", 0), g("m", 1)],
     COMMON + ["--nodes=1", "--nodelist=m", "--ntasks-per-node=2",
               "--gres=gpu:a100:1,gpu:h100:1"]),
    ("untyped GPU when Slurm has no type for it", [g("u", 0)],
     COMMON + ["--nodes=1", "--nodelist=u", "--ntasks-per-node=1", "--gres=gpu:1"]),
    ("CPUs and memory per node", [g("a", 0, cpu_milli=4000, memory_mib=8192),
                                  g("a", 1, cpu_milli=4000, memory_mib=8192)],
     COMMON + ["--nodes=1", "--nodelist=a", "--ntasks-per-node=2", "--gres=gpu:h100:2",
               "--cpus-per-task=4", "--mem=16384M"]),
]


@pytest.mark.parametrize("case,placement,expected", TABLE, ids=[t[0] for t in TABLE])
def test_placement_to_sbatch_arguments(case, placement, expected):
    args = sbatch_args(placement, account="lattice", partition="gpubudget", time_s=7200,
                       job_name="gpubudget.w1.1", comment="c",
                       gpu_type=lambda n, i: TYPES.get((n, i)), mig_types=MIG)
    assert args[:4] == HEAD
    assert args[4:] == expected, case


def test_extra_job_wide_options_come_before_the_components():
    args = sbatch_args([g("a", 0)], account="x", partition="p", time_s=60, job_name="n",
                       extra=["--export=NONE"])
    assert args.index("--export=NONE") < args.index("--partition=p")


@pytest.mark.parametrize("placement,kw,field", [
    ([], {}, "placement"),
    ([{"gpu": 0}], {}, "placement[0].node"),
    ([{"node": "a", "gpu": 0, "kind": "mps", "milli": 0}], {}, "placement[0].milli"),
    ([{"node": "a", "gpu": 0, "kind": "mig"}], {}, "placement[0].profile"),
    ([{"node": "a", "gpu": 0, "kind": "tpu"}], {}, "placement[0].kind"),
    ([g("a", 0)], {"account": "two words"}, "account"),
    ([g("a", 0)], {"job_name": ""}, "job_name"),
])
def test_bad_placements_are_refused_naming_the_field(placement, kw, field):
    base = {"account": "lattice", "partition": "p", "time_s": 60, "job_name": "n"}
    with pytest.raises(SlurmMapError, match=field.replace("[", r"\[").replace("]", r"\]")):
        sbatch_args(placement, **{**base, **kw})


@pytest.mark.parametrize("seconds,expected", [
    (1, "0-00:01:00"), (60, "0-00:01:00"), (61, "0-00:02:00"), (7200, "0-02:00:00"),
    (3 * 86400 + 90, "3-00:02:00")])
def test_slurm_time(seconds, expected):
    assert slurm_time(seconds) == expected


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan")])
def test_slurm_time_refuses_nonsense(bad):
    with pytest.raises(SlurmMapError, match="time"):
        slurm_time(bad)


def test_job_time_prefers_the_limit_then_protection_plus_headroom():
    assert job_time(600, 3600, 900, 86400) == 600
    assert job_time(None, 3600, 900, 86400) == 4500
    assert job_time(None, 0, 900, 86400) == 86400


def test_job_names_round_trip():
    assert job_name("gpubudget", "abc", 2) == "gpubudget.abc.2"
    assert parse_job_name("gpubudget", "gpubudget.abc.2") == ("abc", 2)
    assert parse_job_name("gpubudget", job_name("gpubudget", "s1")) == ("s1", None)
    assert parse_job_name("gpubudget", "spawner-jupyterhub") is None
    assert parse_job_name("gpubudget", "gpubudgetx.abc.2") is None


# ------------------------------------------------------------------ scontrol
SCONTROL = """\
NodeName=gpu1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=2.10 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:2 NodeAddr=127.0.0.1 NodeHostName=vm Port=60127 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=8000 AllocMem=0 FreeMem=16436 Sockets=4 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpubudget  BootTime=2026-12-01T07:42:00 SlurmdStartTime=2026-12-01T07:52:26 LastBusyTime=2026-12-01T07:52:26 CfgTRES=cpu=4,mem=8000M,billing=4,gres/gpu=2,gres/gpu:h100=2 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
NodeName=gpu2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 Gres=gpu:h100:2(S:0-1) NodeAddr=127.0.0.1 RealMemory=8000 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpubudget Reason=gpubudget: slurm: DOWN+NOT_RESPONDING [root@2026-12-01T08:00:00]
NodeName=mig1 CPUTot=64 Gres=gpu:nvidia_h200_1g.18gb:7,gpu:nvidia_h200_3g.71gb:2,gpu:h200:1 RealMemory=512000 State=MIXED+NOT_RESPONDING Partitions=gpubudget,debug
NodeName=cpu1 CPUTot=32 Gres=(null) RealMemory=64000 State=DOWN+NOT_RESPONDING Partitions=gpubudget Reason=Not responding [slurm@2026-12-01T08:01:00]
NodeName=other CPUTot=8 Gres=gpu:a100:4 RealMemory=64000 State=IDLE Partitions=cpu
"""


def test_scontrol_nodes_parse_with_spaces_in_values():
    nodes = {n.name: n for n in parse_nodes(SCONTROL)}
    assert set(nodes) == {"gpu1", "gpu2", "mig1", "cpu1", "other"}
    assert nodes["gpu1"].state == {"IDLE"} and nodes["gpu1"].cpus == 4
    assert nodes["gpu1"].memory_mib == 8000
    assert nodes["gpu2"].state == {"IDLE", "DRAIN"}
    assert nodes["gpu2"].reason.startswith("gpubudget: slurm: DOWN+NOT_RESPONDING")
    assert nodes["mig1"].partitions == ("gpubudget", "debug")
    assert parse_gres("gpu:h100:2(S:0-1),mps:200") == (
        parse_gres("gpu:h100:2")[0], parse_gres("mps:200")[0])
    assert parse_gres("(null)") == ()
    assert parse_gres("gpu:3")[0].type is None and parse_gres("gpu:3")[0].count == 3


def test_bad_scontrol_number_names_the_line_and_key():
    with pytest.raises(SlurmMapError, match="line 1: CPUTot"):
        parse_nodes("NodeName=x CPUTot=many State=IDLE")


def test_inventory_from_slurm_nodes_typed_gres_and_mig():
    inv = inventory_from_nodes(parse_nodes(SCONTROL), {"h100": "H100-80GB", "h200": "H200-141GB"},
                               MIG, partition="gpubudget")
    assert inv.source == "slurm"
    by = {n.name: n for n in inv.nodes}
    assert set(by) == {"gpu1", "gpu2", "mig1", "cpu1"}  # "other" is in another partition
    assert [x.model for x in by["gpu1"].gpus] == ["H100-80GB", "H100-80GB"]
    assert by["gpu1"].gpus[0].memory_mib == 81559 and not by["gpu1"].gpus[0].mig
    assert by["gpu1"].cpu_milli == 4000 and by["gpu1"].memory_mib == 8000
    # 7 x 1g (7 compute slices) + 2 x 3g (6 slices) = 13 slices -> two MIG-enabled H200s,
    # after the one whole H200
    mig = by["mig1"].gpus
    assert [(x.model, x.mig) for x in mig] == [("H200-141GB", False), ("H200-141GB", True),
                                                ("H200-141GB", True)]
    assert by["cpu1"].gpus == ()


def test_unknown_mig_profile_is_an_error_naming_it():
    nodes = parse_nodes("NodeName=z CPUTot=1 Gres=gpu:weird:1 State=IDLE Partitions=p")
    with pytest.raises(SlurmMapError, match="9g.99gb"):
        inventory_from_nodes(nodes, {}, {"9g.99gb": "weird"}, partition="p")


def test_node_health_hard_states_at_once_transient_after_grace():
    nodes = parse_nodes(SCONTROL)
    health, seen = node_health(nodes, {}, now=100.0, grace=30.0)
    assert set(health) == {"gpu2", "cpu1"}  # DRAIN, DOWN; mig1 only NOT_RESPONDING so far
    assert "DRAIN" in health["gpu2"] and "gpubudget: slurm" in health["gpu2"]
    assert seen == {"mig1": 100.0, "cpu1": 100.0}
    health, seen = node_health(nodes, seen, now=129.0, grace=30.0)
    assert "mig1" not in health
    health, seen = node_health(nodes, seen, now=130.0, grace=30.0)
    assert "mig1" in health and "NOT_RESPONDING" in health["mig1"]
    healthy = parse_nodes("NodeName=mig1 CPUTot=1 State=MIXED Partitions=gpubudget")
    health, seen = node_health(healthy, seen, now=131.0, grace=30.0)
    assert health == {} and seen == {}  # back: the grace starts afresh next time


# ------------------------------------------------------------------ squeue / sacct
def test_squeue_merges_heterogeneous_components():
    jobs = parse_squeue("7+0|gpubudget.w.1|RUNNING|ana|gpu1|gres:gpu:h100:1\n"
                        "7+1|gpubudget.w.1|RUNNING|ana|gpu2|gres:gpu:h100:2\n"
                        "8|other|PENDING|ben||N/A\n")
    assert [(j.job_id, j.state, j.nodes) for j in jobs] == [
        ("7", "RUNNING", "gpu1,gpu2"), ("8", "PENDING", "")]
    assert jobs[0].gres == ("gres:gpu:h100:1", "gres:gpu:h100:2")


def test_sacct_merges_components_and_maps_exit_status():
    recs = {r.job_id: r for r in parse_sacct(
        "7+0|gpubudget.w.1|COMPLETED|0:0|100|150|gpu1|ana|gres/gpu:h100=1,gres/gpu=1\n"
        "7+1|gpubudget.w.1|COMPLETED|0:0|101|151|gpu2|ana|gres/gpu:h100=2,gres/gpu=2\n"
        "9|gpubudget.x.2|CANCELLED by 0|0:15|10|20|gpu1|ben|\n"
        "14|gpubudget.c.1|CANCELLED by 0|0:0|10|20|gpu1|ben|\n"
        "10|gpubudget.y.1|FAILED|3:0|10|20|gpu1|ben|\n"
        "11|gpubudget.z.1|NODE_FAIL|0:0|10|20|gpu1|ben|\n"
        "12|gpubudget.p.1|PENDING|0:0|Unknown|Unknown|None assigned|ben|\n"
        "13|gpubudget.t.1|TIMEOUT|0:0|10|20|gpu1|ben|\n")}
    assert (recs["7"].start, recs["7"].end, recs["7"].nodes) == (100, 151, "gpu1,gpu2")
    assert recs["7"].gres == ("gres/gpu:h100=1", "gres/gpu=1", "gres/gpu:h100=2", "gres/gpu=2")
    assert exit_status(recs["7"]) == 0
    assert recs["9"].state == "CANCELLED" and exit_status(recs["9"]) == 143
    assert exit_status(recs["14"]) == 143
    assert exit_status(recs["10"]) == 3
    assert exit_status(recs["11"]) is None  # lost with its node
    assert recs["12"].start is None and recs["12"].end is None
    assert exit_status(recs["13"]) == 1


# ------------------------------------------------------------------ usage reconciliation
def rec(jid: str, start: float | None, end: float | None) -> JobRecord:
    return JobRecord(jid, "n", "COMPLETED", start=start, end=end)


def test_usage_mismatches_over_threshold_only():
    ivs = [Interval("w", 1, 100.0, 200.0), Interval("w", 2, 300.0, 400.0),
           Interval("s", 1, 10.0, 50.0), Interval("gone", 1, 0.0, 30.0),
           Interval("never", 1, 0.0, 30.0)]
    jobs = {"w": [(1, rec("1", 101.0, 199.5)), (2, rec("2", 300.0, 460.0))],
            "s": [(None, rec("3", 12.0, 49.0))],  # a session: matched in start order
            "never": [(1, rec("4", None, None))]}
    out = {(m["workload"], m["attempt"]): m for m in usage_mismatches(ivs, jobs, 5.0)}
    assert set(out) == {("w", 2), ("gone", 1), ("never", 1)}
    assert out[("w", 2)]["difference_s"] == 60.0 and out[("w", 2)]["slurm_job"] == "2"
    assert out[("gone", 1)]["why"] == "no Slurm job found"
    assert out[("never", 1)]["why"] == "never started in Slurm"
    assert usage_mismatches(ivs[:3], jobs, 100.0) == []


# ------------------------------------------------------------------ accounts
BUDGETS = """\
admins: [root]
accounts:
  Physics:
    grant: 100
    managers: [mia]
    children:
      lattice: {grant: 60, members: [ana]}
      astro: {grant: 40, members: [ben]}
  scratch: {grant: 0, members: [ben]}
"""


def test_account_plan_mirrors_the_tree_and_is_idempotent():
    tree = load_budgets(BUDGETS).accounts
    plan = account_plan(tree, {"root": ""}, set())
    assert plan.add_accounts == (("gpubudget", "root"), ("physics", "gpubudget"),
                                 ("lattice", "physics"), ("astro", "physics"),
                                 ("scratch", "gpubudget"))
    assert set(plan.add_users) == {("ana", "lattice"), ("ben", "astro"), ("ben", "scratch"),
                                   ("mia", "lattice"), ("mia", "astro")}
    assert plan.commands()[0] == ["-i", "add", "account", "gpubudget", "parent=root",
                                  "Organization=gpubudget", "Description=gpubudget gpubudget"]
    have_accounts = {"root": "", **{a: p for a, p in plan.add_accounts}}
    again = account_plan(tree, have_accounts, set(plan.add_users))
    assert again.empty and again.commands() == []


def test_account_plan_moves_and_prunes_only_below_its_root():
    tree = load_budgets(BUDGETS).accounts
    have = {"root": "", "gpubudget": "root", "physics": "gpubudget", "lattice": "gpubudget",
            "astro": "physics", "scratch": "gpubudget", "old": "physics", "hpc": "root"}
    users = {("ana", "lattice"), ("ben", "astro"), ("ben", "scratch"), ("mia", "lattice"),
             ("mia", "astro"), ("zed", "old"), ("zed", "hpc"), ("ana", "astro")}
    plan = account_plan(tree, have, users, prune=True)
    assert plan.move_accounts == (("lattice", "physics"),)
    assert plan.remove_users == (("ana", "astro"), ("zed", "old"))  # not zed's hpc
    assert plan.remove_accounts == ("old",)
    assert account_plan(tree, have, users).remove_accounts == ()  # no prune, no removal


def test_account_names_collide_with_a_clear_error():
    tree = load_budgets("accounts:\n  Lab: {grant: 1}\n  lab: {grant: 1}\n").accounts
    with pytest.raises(SlurmMapError, match="accounts.lab: Slurm account 'lab'"):
        account_plan(tree, {}, set())
    plan = account_plan(tree, {}, set(), mapping={"Lab": "lab-big"})
    assert ("lab-big", "gpubudget") in plan.add_accounts


def test_sacctmgr_association_parsing():
    out = "root||\nroot||root\ngpubudget|root|\nlattice|physics|\nlattice||ana\n"
    assert parse_sacctmgr_accounts(out) == {"root": "", "gpubudget": "root",
                                            "lattice": "physics"}
    assert parse_sacctmgr_users(out) == {("root", "root"), ("ana", "lattice")}


def test_job_array_tasks_are_jobs_of_their_own():
    """A task of a Slurm job array (``12_3``) and the array's held remainder
    (``12_[4-6%2]``) are told apart, not merged into one job ``12``; their indices and the
    ``--array`` value of a set of indices."""
    from jupyter_gpubudget.backends.slurm_map import array_indices, array_spec

    jobs = parse_squeue("12_3|gpubudget.a_3.1|RUNNING|ana|gpu1|gres:gpu:h100:1|5|N/A|None\n"
                        "12_[4-6%2]|gpubudget.a.array|PENDING|ana||N/A|N/A|N/A|JobHeldUser\n")
    assert [(j.job_id, j.state, j.reason) for j in jobs] == [
        ("12_3", "RUNNING", "None"), ("12_[4-6%2]", "PENDING", "JobHeldUser")]
    assert array_indices("12_[4-6%2]") == ("12", {4, 5, 6})
    assert array_indices("12_3") == ("12", {3})
    assert array_indices("12") is None and array_indices("12+1") is None
    assert array_spec([7, 0, 1, 2, 4, 5], 3) == "0-2,4-5,7%3"
    assert array_spec([9]) == "9"
    with pytest.raises(SlurmMapError):
        array_spec([])
