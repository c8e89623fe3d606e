"""Slurm backend: the core decides, Slurm runs what it decided.

- **Batch jobs**: when the core starts an attempt, ``sbatch`` runs *as the job's user*
  (``user_command_prefix``, ``sudo -n -u {user} --`` by default) with the core's nodes
  (``--nodelist``), GRES (``--gres=gpu:<type>:N``, MIG profiles and MPS shares mapped),
  ``--nodes``/``--ntasks-per-node`` for gangs (a heterogeneous job when the gang's nodes get
  different GRES), ``--account`` mapped from the project, ``--time`` from the time limit or
  the protected time plus headroom, ``--job-name=gpubudget.<workload>.<attempt>`` and
  ``--comment`` identifying the attempt. Nothing waits in Slurm: a job is submitted only when
  the core placed it, into a partition that only the gpubudget host may submit to, so Slurm's
  own fair share never orders these jobs (see docs/backends.md, "Slurm"). The exception:
  a **job array** is one Slurm job array (``sbatch --array=<indices>%<max_running> --hold``,
  submitted when its first task starts); each task the core starts is given its node, GRES
  and name (``scontrol update``) and released, so it runs as ``<id>_<index>``. A job that
  runs after others names their Slurm jobs in ``--dependency``; while they run it waits in
  Slurm too, held with that dependency, and is released the same way when the core starts it.
- **Status** from ``squeue`` (alive) and ``sacct`` (how and when it ended), found by job name,
  so a restarted service finds its jobs again. **Stop** (preemption, cancel) is ``scancel``
  as the user; a resumable job is requeued by the core and resubmitted as its next attempt
  wherever the core places it then (``--no-requeue``: Slurm never requeues on its own).
- **Nodes**: ``scontrol show node -o`` gives the inventory (typed GPU GRES → core models,
  MIG GRES → MIG-enabled GPUs) and health (DOWN/DRAIN/FAIL at once; NOT_RESPONDING after a
  grace); the core's drain is written back with ``scontrol update nodename=… state=drain``.
- **Usage**: ``sacct`` start/end of every ended attempt is compared with the ledger's charge
  interval (the ledger stays the truth); a difference over ``usage_threshold`` is reported.
- **Notebooks**: :func:`configure_slurmspawner` turns a session's placement into batchspawner's
  ``SlurmSpawner`` request (``BudgetSpawner.child_configurer``).

The mapping itself (placement → sbatch arguments, scontrol → inventory, …) is pure and lives
in :mod:`jupyter_gpubudget.backends.slurm_map`.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import threading
import time
from typing import Any

from traitlets import Bool, Dict, Float, List, Unicode

from .base import Backend, BackendStatus, Launch, job_identity_env
from .slurm_map import (
    ALIVE,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    Interval,
    JobRecord,
    SlurmMapError,
    SlurmNode,
    array_indices,
    array_spec,
    components,
    exit_status,
    inventory_from_nodes,
    is_drained,
    job_name,
    job_time,
    node_gpus,
    node_health,
    parse_job_name,
    parse_nodes,
    parse_sacct,
    parse_squeue,
    sbatch_args,
    slurm_time,
    usage_mismatches,
)

#: environment variables of the hub's placement environment that Slurm sets itself for the job
SLURM_SETS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
              "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")

#: the signals a job may ask for ahead of a likely preemption (``warn_signal``: the service's
#: WARN_SIGNALS; never KILL or STOP, which ``scancel --signal`` would send as well)
WARN_SIGNALS = ("USR1", "USR2", "INT", "TERM", "HUP")


class SlurmError(RuntimeError):
    pass


class SlurmBackend(Backend):
    """Runs the core's decisions on a Slurm cluster (see the module docstring)."""

    name = "slurm"

    partition = Unicode("gpubudget", help=(
        "Slurm partition every gpubudget job is submitted to. It should hold the GPU nodes "
        "the core schedules, be in no other partition, and admit submissions only from the "
        "gpubudget host (AllocNodes=): then only the core decides what runs there."
    )).tag(config=True)
    job_name_prefix = Unicode("gpubudget", help=(
        "Jobs are named <prefix>.<workload>.<attempt> (sessions: <prefix>.<session>); the "
        "service finds its jobs by this name after a restart.")).tag(config=True)
    gpu_models = Dict({}, help=(
        "Slurm GPU GRES type -> core GPU model (a key of the MIG tables, e.g. "
        "{'h100': 'H100-80GB', 'a100': 'A100-80GB'}). Unmapped types become models of the "
        "same name.")).tag(config=True)
    mig_types = Dict({}, help=(
        "Core MIG profile -> Slurm GRES type of that MIG instance (e.g. {'1g.18gb': "
        "'nvidia_h200_1g.18gb'} for AutoDetect=nvml names). Unmapped profiles use the profile "
        "name itself as the GRES type.")).tag(config=True)
    account_map = Dict({}, help=(
        "Budget account -> Slurm account, where they differ (default: the account's name in "
        "lower case). `gpubudget slurm sync-accounts` creates them.")).tag(config=True)
    root_account = Unicode("gpubudget", help=(
        "Slurm account under which the budgets tree is mirrored by sync-accounts.")
    ).tag(config=True)
    time_headroom = Float(3600.0, help=(
        "Seconds added to the protected time (min_runtime) for --time when a job declares no "
        "time limit.")).tag(config=True)
    default_time = Float(86400.0, help=(
        "--time (seconds) for a job with neither a time limit nor a protected time."
    )).tag(config=True)
    session_time_limit = Float(0.0, help=(
        "--time (seconds) for notebook sessions; 0: the session's protected time plus "
        "time_headroom.")).tag(config=True)
    user_command_prefix = List(Unicode(), ["sudo", "-n", "-u", "{user}", "--"], help=(
        "Prefix that runs sbatch/scancel as the job's user ({user}). The default needs a "
        "sudoers rule (docs/backends.md). Empty when the service runs as the user itself."
    )).tag(config=True)
    admin_command_prefix = List(Unicode(), [], help=(
        "Prefix for `scontrol update node` (drain/resume), which needs a Slurm admin "
        "(AdminLevel=Admin, SlurmUser or root): e.g. ['sudo', '-n', '-u', 'slurm', '--'].")
    ).tag(config=True)
    slurm_bin_dir = Unicode("", help="Directory of the Slurm commands (default: found on PATH)."
                            ).tag(config=True)
    workdir_template = Unicode("{home}", help=(
        "Working directory of a batch job ({user}, {home}).")).tag(config=True)
    output_template = Unicode("{workdir}/gpubudget-%x-%j.out", help=(
        "sbatch --output ({user}, {home}, {workdir}; Slurm's %x job name, %j job id)."
    )).tag(config=True)
    job_path = Unicode("/usr/local/bin:/usr/bin:/bin", help=(
        "PATH inside a batch job (jobs start with --export=NONE: nothing of the service's "
        "environment reaches them).")).tag(config=True)
    extra_sbatch_args = List(Unicode(), [], help="More sbatch options for every batch job."
                             ).tag(config=True)
    command_timeout = Float(30.0, help="Seconds one Slurm command may take.").tag(config=True)
    stop_grace = Float(60.0, help=(
        "Seconds a stop waits for Slurm to end the job after scancel (Slurm itself sends "
        "SIGTERM, then SIGKILL after its KillWait).")).tag(config=True)
    start_grace = Float(30.0, help=(
        "Seconds after sbatch during which a job Slurm does not list yet counts as starting."
    )).tag(config=True)
    unresponsive_grace = Float(60.0, help=(
        "Seconds a node may be NOT_RESPONDING/UNKNOWN in Slurm before it is unhealthy to the "
        "core (DOWN, DRAIN and FAIL count at once).")).tag(config=True)
    write_drains = Bool(True, help=(
        "Write the core's drain back to Slurm (scontrol update state=drain); needs "
        "admin_command_prefix or a Slurm admin service user.")).tag(config=True)
    query_cache = Float(1.0, help="Seconds one squeue/scontrol answer is reused."
                        ).tag(config=True)
    watch_interval = Float(5.0, help=(
        "Seconds between squeue polls that notice a job ending (a cycle follows at once)."
    )).tag(config=True)
    accounting_grace = Float(60.0, help=(
        "Seconds a job Slurm lists as ended may wait for its sacct record (slurmdbd writes "
        "it a moment later) before it is settled without an exit code.")).tag(config=True)
    accounting_lookback = Unicode("now-30days", help=(
        "sacct --starttime when looking up ended jobs (Slurm time syntax).")).tag(config=True)
    usage_check_interval = Float(60.0, help=(
        "Seconds between comparisons of the ledger's closed charge intervals with sacct; "
        "0 disables them.")).tag(config=True)
    usage_threshold = Float(30.0, help=(
        "Seconds a job's sacct start or end may differ from its ledger interval before the "
        "difference is logged and recorded as a usage-mismatch decision for admins."
    )).tag(config=True)

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._lock = threading.RLock()
        self._queue: tuple[float, list[JobRecord]] | None = None
        self._nodes: tuple[float, list[SlurmNode]] | None = None
        self._types: dict[str, dict[int, str]] = {}
        self._submitted: dict[tuple[str, int], tuple[str, float]] = {}
        self._first_bad: dict[str, float] = {}
        self._ended_seen: dict[str, float] = {}
        self._watcher: threading.Thread | None = None
        self._watching: set[str] = set()
        self._ledger: Any = None
        self._arrays: dict[str, str] = {}  # gpubudget array id -> its Slurm job array's id

    def use_ledger(self, ledger: Any) -> None:
        """The service's ledger, read for what a Slurm job carries beyond one attempt: the
        job array a task belongs to (its indices, ``max_running``) and the jobs it runs
        after (their Slurm ids)."""
        self._ledger = ledger

    # ------------------------------------------------------------------ commands
    def _exe(self, cmd: str) -> str:
        return os.path.join(self.slurm_bin_dir, cmd) if self.slurm_bin_dir else cmd

    def _run(self, argv: list[str], *, user: str | None = None, admin: bool = False,
             stdin: str | None = None) -> str:
        prefix: list[str] = []
        if user is not None:
            prefix = [p.replace("{user}", user) for p in self.user_command_prefix]
        elif admin:
            prefix = list(self.admin_command_prefix)
        full = [*prefix, self._exe(argv[0]), *argv[1:]]
        env = dict(os.environ, SLURM_TIME_FORMAT="%s")
        try:
            p = subprocess.run(full, input=stdin, capture_output=True, text=True, env=env,
                               timeout=self.command_timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"{shlex.join(full)}: {e}") from e
        if p.returncode != 0:
            raise SlurmError(f"{shlex.join(full)} -> {p.returncode}: "
                             f"{(p.stderr or p.stdout).strip()[:500]}")
        return p.stdout

    # ------------------------------------------------------------------ queries
    def queue(self, fresh: bool = False) -> list[JobRecord]:
        """The partition's jobs in slurmctld (alive, and recently ended ones)."""
        with self._lock:
            now = time.monotonic()
            if not fresh and self._queue and now - self._queue[0] < self.query_cache:
                return self._queue[1]
            out = self._run(["squeue", "-h", "-t", "all", "-p", self.partition,
                             "-o", SQUEUE_FORMAT])
            jobs = parse_squeue(out)
            self._queue = (time.monotonic(), jobs)
            return jobs

    def nodes(self, fresh: bool = False) -> list[SlurmNode]:
        with self._lock:
            now = time.monotonic()
            if not fresh and self._nodes and now - self._nodes[0] < self.query_cache:
                return self._nodes[1]
            nodes = parse_nodes(self._run(["scontrol", "show", "node", "-o"]))
            self._nodes = (time.monotonic(), nodes)
            for n in nodes:
                self._types[n.name] = node_gpus(n, self.gpu_models, self.mig_types)[1]
            return nodes

    def accounting(self, names: list[str]) -> list[JobRecord]:
        """sacct records of the jobs with these names (ended or not)."""
        if not names:
            return []
        out = self._run(["sacct", "-X", "-n", "-P", f"--format={SACCT_FIELDS}",
                         f"--starttime={self.accounting_lookback}", "--endtime=now",
                         f"--name={','.join(names)}"])
        return parse_sacct(out)

    def _alive_jobs(self, name: str, fresh: bool = False) -> list[JobRecord]:
        return [j for j in self.queue(fresh) if j.name == name and j.state in ALIVE]

    def gpu_type(self, node: str, gpu: int) -> str | None:
        """The Slurm GRES type of a node's GPU (None: untyped or unknown)."""
        if node not in self._types:
            try:
                self.nodes(fresh=True)
            except SlurmError as e:
                self.log.warning("slurm: no GRES types for %s (%s); requesting untyped gpu",
                                 node, e)
                self._types[node] = {}
        return self._types.get(node, {}).get(gpu)

    def account_for(self, project: str) -> str:
        return self.account_map.get(project, project.lower())

    # ------------------------------------------------------------------ launch
    def _home(self, user: str) -> str:
        try:
            return pwd.getpwnam(user).pw_dir
        except KeyError:
            raise SlurmError(f"user {user!r} has no Unix account here: Slurm runs jobs as "
                             "the user, so every gpubudget user needs one") from None

    def job_script(self, launch: Launch) -> str:
        # the job starts with --export=NONE; SLURM_EXPORT_ENV=ALL lets its own srun steps
        # see the environment set here (otherwise they inherit NONE and get no PATH)
        return self._script(launch, slurm_array=False)

    def _script(self, launch: Launch, slurm_array: bool) -> str:
        """The job script; ``slurm_array``: it runs as a task of a Slurm job array, whose
        index (``SLURM_ARRAY_TASK_ID``, set by Slurm) gives the task's own variables."""
        env = {"PATH": self.job_path, **launch.env, "SLURM_EXPORT_ENV": "ALL",
               **job_identity_env(launch)}
        own: dict[str, str] = {}
        if "GPUBUDGET_ARRAY_INDEX" in launch.env:
            if slurm_array:  # Slurm sets SLURM_ARRAY_TASK_ID; the rest follows from it
                aid = launch.env.get("GPUBUDGET_ARRAY_ID", "")
                own = {"GPUBUDGET_ARRAY_INDEX": '"$SLURM_ARRAY_TASK_ID"',
                       "GPUBUDGET_WORKLOAD": f'{shlex.quote(aid)}"_$SLURM_ARRAY_TASK_ID"'}
                for k in own:
                    env.pop(k, None)
            else:  # a task run as a plain job: as Slurm's own
                env["SLURM_ARRAY_TASK_ID"] = launch.env["GPUBUDGET_ARRAY_INDEX"]
        lines = ["#!/bin/sh",
                 f"# gpubudget workload {launch.workload} attempt {launch.attempt} "
                 f"(project {launch.project})"]
        lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())
                  if k.replace("_", "a").isalnum() and not k[:1].isdigit()]
        lines += [f"export {k}={v}" for k, v in own.items()]
        lines.append("exec " + shlex.join(launch.command))
        return "\n".join(lines) + "\n"

    def sbatch_args_for(self, launch: Launch, job_name_: str | None = None,
                        comment: str | None = None) -> list[str]:
        home = self._home(launch.user)
        workdir = self.workdir_template.format(user=launch.user, home=home)
        output = self.output_template.format(user=launch.user, home=home, workdir=workdir)
        t = job_time(launch.time_limit, launch.min_runtime, self.time_headroom,
                     self.default_time)
        return sbatch_args(
            launch.placement, account=self.account_for(launch.project),
            partition=self.partition, time_s=t,
            job_name=job_name_ or job_name(self.job_name_prefix, launch.workload,
                                           launch.attempt),
            comment=comment or f"gpubudget:{launch.workload}:{launch.attempt}:{launch.project}",
            gpu_type=self.gpu_type, mig_types=self.mig_types,
            extra=["--export=NONE", f"--chdir={workdir}", f"--output={output}",
                   *self.extra_sbatch_args])

    def launch(self, launch: Launch) -> str:
        if not launch.command:
            raise SlurmError("the job has no command")
        name = job_name(self.job_name_prefix, launch.workload, launch.attempt)
        row = self._row(launch.workload)
        after = self._dependency(row)
        try:
            args = self.sbatch_args_for(launch)
        except SlurmMapError as e:
            raise SlurmError(str(e)) from e
        job_id = None
        task = self._array_task(launch, row)
        if task is not None:  # a task of a job array: a task of Slurm's own job array
            try:
                job_id = self._release_task(launch, task, args, after)
            except SlurmError as e:
                self.log.warning("slurm: %s as a task of its Slurm job array: %s; "
                                 "submitted as a one-task array", launch.workload, e)
            if job_id is None:
                try:
                    job_id = self._sbatch(launch, [*_array_output(args, None), *after,
                                                   f"--array={task[1]}"],
                                          slurm_array=True) + f"_{task[1]}"
                except SlurmError as e:  # (past the cluster's MaxArraySize)
                    self.log.warning("slurm: %s as a one-task array: %s; submitted as a "
                                     "job", launch.workload, e)
        elif after:  # a job after others: the Slurm job held for it since they started
            job_id = self._release_held(launch)
        if job_id is None:
            job_id = self._sbatch(launch, [*args, *after])
        args = [*args, *after]
        with self._lock:
            self._submitted[(launch.workload, launch.attempt)] = (job_id, time.time())
            self._queue = None
            self._watching.add(name)
        self._ensure_watcher()
        self.log.info("slurm: %s attempt %d is job %s (%s)", launch.workload, launch.attempt,
                      job_id, " ".join(args))
        return job_id

    def _sbatch(self, launch: Launch, args: list[str], slurm_array: bool = False) -> str:
        out = self._run(["sbatch", *args], user=launch.user,
                        stdin=self._script(launch, slurm_array))
        job_id = out.strip().splitlines()[-1].split(";")[0].strip() if out.strip() else ""
        if not job_id.isdigit():
            raise SlurmError(f"sbatch gave no job id: {out.strip()[:200]!r}")
        return job_id

    # ------------------------------------------------------------------ arrays, dependencies
    def _row(self, workload: str) -> Any:
        if self._ledger is None:
            return None
        try:
            return self._ledger.get(workload)
        except Exception as e:  # noqa: BLE001 - a plain job then, as without a ledger
            self.log.warning("slurm: %s not read from the ledger (%s)", workload, e)
            return None

    def _dependency(self, row: Any) -> list[str]:
        """``--dependency=<kind>:<id>:...`` naming the Slurm jobs (their last attempts) of
        the jobs this one runs after that ran on Slurm, so that squeue and scontrol show
        them. The service has already seen the condition hold (it gates the start itself):
        Slurm finds it fulfilled, and counts a job it no longer remembers (ended more than
        MinJobAge ago) as fulfilled too."""
        if row is None or not getattr(row, "after", None):
            return []
        ids = []
        for wid in str(row.after).split():
            pred = self._row(wid)
            ref = getattr(pred, "backend_ref", None) or ""
            if pred is not None and pred.backend == self.name and \
                    ref.replace("_", "").isdigit():
                ids.append(ref)
        if not ids:
            return []
        return [f"--dependency={row.after_kind or 'afterok'}:{':'.join(ids)}"]

    def _held_name(self, workload: str) -> str:
        """The name of the Slurm job held for a job that runs after others."""
        return f"{self.job_name_prefix}.{workload}.after"

    def _release_held(self, launch: Launch) -> str | None:
        """The Slurm job held for this job while the jobs it runs after ran (see
        :meth:`_sweep_held`), given this attempt's node, GRES, name and comment and released
        (``scontrol update``, ``scontrol release``), as a task of a Slurm job array is. None:
        there is none, or this attempt cannot be one (a gang, CPUs or memory of its own, on
        lent GPUs): then it is cancelled and the attempt submitted as a job of its own."""
        name = self._held_name(launch.workload)
        try:
            held = [j for j in self.queue(fresh=True) if j.name == name and j.state in ALIVE]
        except SlurmError as e:
            self.log.warning("slurm: %s: no held job found (%s)", launch.workload, e)
            return None
        if not held:
            return None
        comps = components(launch.placement, self.gpu_type, self.mig_types)
        c = comps[0]
        if launch.attempt == 1 and launch.due_at is None and len(held) == 1 \
                and held[0].state == "PENDING" and len(comps) == 1 and len(c.nodes) == 1 \
                and c.ntasks_per_node == 1 and not (c.cpus_per_task or c.mem_mib or c.gpu_bind):
            jid = held[0].job_id
            upd = ["scontrol", "update", f"JobId={jid}",
                   f"JobName={job_name(self.job_name_prefix, launch.workload, launch.attempt)}",
                   f"ReqNodeList={c.nodes[0]}",
                   f"Comment=gpubudget:{launch.workload}:{launch.attempt}:{launch.project}"]
            if c.gres:
                upd.append(f"Gres={c.gres}")
            try:
                self._run(upd, user=launch.user)
                self._run(["scontrol", "release", jid], user=launch.user)
                return jid
            except SlurmError as e:
                self.log.warning("slurm: %s: its held job %s not released (%s); submitted "
                                 "as a job of its own", launch.workload, jid, e)
        for j in held:
            try:
                self._run(["scancel", j.job_id], user=j.user or None)
            except SlurmError as e:
                self.log.warning("slurm: scancel %s: %s", j.job_id, e)
        return None

    def _sweep_held(self, jobs: list[JobRecord]) -> None:
        """Jobs that run after others wait in Slurm too, so that squeue shows them and
        their dependency: a pending job whose predecessors all run (or ran) on Slurm, one at
        least still running, is submitted held (``--hold``, ``--dependency=<kind>:<their
        ids>``, named ``<prefix>.<workload>.after``), to be released when the core starts it
        (:meth:`_release_held`). The core alone decides: a held job whose workload no longer
        waits (cancelled, its condition no longer able to hold), or that is no longer held,
        is cancelled."""
        if self._ledger is None:
            return
        prefix, suffix = self.job_name_prefix + ".", ".after"
        live = self._ledger.live(backend=self.name)
        running = {r.id for r in live if r.state == "running"}
        waiting = {r.id: r for r in live
                   if r.state == "pending" and r.after and r.array_id is None}
        held = set()
        for j in jobs:
            if j.state not in ALIVE or not j.name.startswith(prefix) \
                    or not j.name.endswith(suffix):
                continue
            wid = j.name[len(prefix):-len(suffix)]
            if wid in waiting and wid not in held and j.state == "PENDING" \
                    and j.reason.startswith("JobHeld"):
                held.add(wid)
                continue
            self.log.info("slurm: %s (%s) no longer waits held: cancelled", j.job_id, j.name)
            try:
                self._run(["scancel", j.job_id], user=j.user or None)
            except SlurmError as e:
                self.log.warning("slurm: scancel %s: %s", j.job_id, e)
        for wid, r in waiting.items():
            if wid in held or running.isdisjoint(str(r.after).split()):
                continue  # (none of its predecessors runs: read no further)
            preds = [self._row(p) for p in str(r.after).split()]
            if not preds or any(p is None or p.backend != self.name or not (
                    p.backend_ref or "").replace("_", "").isdigit() for p in preds) \
                    or not any(p.state == "running" for p in preds):
                continue  # (not all on Slurm yet, or none runs: the core starts it soon)
            row = self._row(wid)
            if row is None:
                continue
            try:
                self._submit_held(row)
            except (SlurmError, SlurmMapError) as e:
                self.log.warning("slurm: %s not submitted held: %s", wid, e)

    def _submit_held(self, row: Any) -> str:
        """Submit ``row`` (a pending job that runs after others) held, with its dependency:
        the job's script and account, time and output; its node and GRES come when the core
        starts it."""
        launch = Launch(workload=row.id, attempt=1, user=row.user, project=row.project,
                        command=list(row.command or []), placement=[],
                        env=dict(row.env or {}), kind=row.kind, min_runtime=row.min_runtime,
                        resumable=row.resumable, time_limit=row.time_limit)
        home = self._home(row.user)
        workdir = self.workdir_template.format(user=row.user, home=home)
        output = self.output_template.format(user=row.user, home=home, workdir=workdir)
        output = output.replace("%x", job_name(self.job_name_prefix, row.id, 1))
        t = job_time(row.time_limit, row.min_runtime, self.time_headroom, self.default_time)
        args = ["--parsable", f"--job-name={self._held_name(row.id)}", "--no-requeue",
                "--export=NONE", f"--chdir={workdir}", f"--output={output}",
                *self.extra_sbatch_args, f"--comment=gpubudget:{row.id}:after:{row.project}",
                f"--partition={self.partition}", f"--account={self.account_for(row.project)}",
                f"--time={slurm_time(t)}", "--nodes=1", *self._dependency(row), "--hold"]
        sid = self._sbatch(launch, args)
        with self._lock:
            self._queue = None
        self.log.info("slurm: %s waits in Slurm as held job %s (%s)", row.id, sid,
                      " ".join(args))
        return sid

    def _array_task(self, launch: Launch, row: Any) -> tuple[str, int] | None:
        """(array id, index) of a task of a job array run as a task of a Slurm job array:
        each of its attempts (a one-task array for a requeued attempt); None: a plain job
        (no array, or a gang over several nodes or kinds of GPUs)."""
        if row is None or getattr(row, "array_id", None) is None or row.array_index is None:
            return None
        comps = components(launch.placement, self.gpu_type, self.mig_types)
        if len(comps) != 1 or len(comps[0].nodes) != 1:
            return None
        return str(row.array_id), int(row.array_index)

    def _release_task(self, launch: Launch, task: tuple[str, int], args: list[str],
                      after: list[str]) -> str | None:
        """Task ``index`` of the array's Slurm job array, held until now: given this
        attempt's node, GRES, name and comment, then released (``scontrol update``,
        ``scontrol release``). The array is submitted (held, ``--array=<its pending
        indices>%max_running``) by its first task to start. None: the Slurm array has no
        such task waiting (a requeued attempt, a remainder cancelled by hand)."""
        if launch.attempt != 1 or launch.due_at is not None:
            return None  # (due_at: the lent GPUs' return is in the job's own script)
        aid, index = task
        sid = self._slurm_array(launch, aid, after)
        if sid is None:
            return None
        held = [j for j in self.queue(fresh=True)
                if (got := array_indices(j.job_id)) and got[0] == sid and index in got[1]
                and j.state == "PENDING"]
        if not held:
            return None
        comp = components(launch.placement, self.gpu_type, self.mig_types)[0]
        tid = f"{sid}_{index}"
        upd = ["scontrol", "update", f"JobId={tid}",
               f"JobName={job_name(self.job_name_prefix, launch.workload, launch.attempt)}",
               f"ReqNodeList={comp.nodes[0]}",
               f"Comment=gpubudget:{launch.workload}:{launch.attempt}:{launch.project}"]
        if comp.gres:
            upd.append(f"Gres={comp.gres}")
        self._run(upd, user=launch.user)
        self._run(["scontrol", "release", tid], user=launch.user)
        return tid

    def _slurm_array(self, launch: Launch, aid: str, after: list[str]) -> str | None:
        """The id of the array's Slurm job array (found by name, ``<prefix>.<array>.array``,
        after a restart), submitted held with the tasks still pending in the ledger (and the
        array's dependency, which its held tasks show) when there is none yet."""
        name = f"{self.job_name_prefix}.{aid}.array"
        with self._lock:
            sid = self._arrays.get(aid)
        if sid is not None:
            return sid
        for j in self.queue(fresh=True):
            if j.name == name and j.state in ALIVE and (got := array_indices(j.job_id)):
                with self._lock:
                    self._arrays[aid] = got[0]
                return got[0]
        rows = self._ledger.array_tasks(aid)
        pending = {r.array_index for r in rows if r.state == "pending"
                   and r.array_index is not None} | {int(launch.env.get(
                       "GPUBUDGET_ARRAY_INDEX", -1))} - {-1}
        cap = next((r.array_max for r in rows if r.array_max), 0)
        held_args = self.sbatch_args_for(
            launch, job_name_=name, comment=f"gpubudget:{aid}:array:{launch.project}")
        held_args = _array_output(held_args, f"{self.job_name_prefix}.{aid}_%a.1")
        sid = self._sbatch(launch, [*held_args, *after, f"--array={array_spec(pending, cap)}",
                                    "--hold"], slurm_array=True)
        with self._lock:
            self._arrays[aid] = sid
        self.log.info("slurm: array %s is Slurm job array %s (%d tasks held)", aid, sid,
                      len(pending))
        return sid

    def _sweep_arrays(self, jobs: list[JobRecord]) -> None:
        """Cancel the held tasks of Slurm job arrays whose gpubudget tasks no longer wait
        (cancelled, or started as jobs of their own), and a task its user released by hand
        (the core did not start it: it has not got its name and node)."""
        if self._ledger is None:
            return
        prefix = self.job_name_prefix + "."
        for j in jobs:
            if j.state not in ALIVE or not j.name.startswith(prefix) \
                    or not j.name.endswith(".array"):
                continue
            got = array_indices(j.job_id)
            if got is None:
                continue
            if j.state != "PENDING" or not j.reason.startswith("JobHeld"):
                tid = f"{got[0]}_[{array_spec(got[1])}]"
                self.log.warning("slurm: %s (%s) was released without the core: cancelled",
                                 tid, j.name)
                try:
                    self._run(["scancel", tid], user=j.user or None)
                except SlurmError as e:
                    self.log.warning("slurm: scancel %s: %s", tid, e)
                continue
            aid = j.name[len(prefix):-len(".array")]
            waiting = {r.array_index for r in self._ledger.array_tasks(aid)
                       if r.state == "pending"}
            gone = sorted(got[1] - waiting)
            if not gone:
                continue
            tid = f"{got[0]}_[{array_spec(gone)}]"  # (never the array's running tasks)
            try:
                self._run(["scancel", tid], user=j.user or None)
            except SlurmError as e:
                self.log.warning("slurm: scancel %s: %s", tid, e)

    # ------------------------------------------------------------------ status / stop
    def status(self, workload: str, attempt: int) -> BackendStatus:
        name = job_name(self.job_name_prefix, workload, attempt)
        try:
            listed = [j for j in self.queue() if j.name == name]
            for j in listed:
                if j.state == "PENDING" and j.reason == "DependencyNeverSatisfied":
                    # the service saw the condition hold (Slurm read its predecessor's end
                    # otherwise, e.g. an exit code the ledger could not know): it decides
                    self.log.warning("slurm: %s: Slurm finds its dependency never "
                                     "satisfied; the service's reading stands", name)
                    self._run(["scontrol", "update", f"JobId={j.job_id}", "Dependency="],
                              user=j.user or None)
            if any(j.state in ALIVE for j in listed):
                with self._lock:
                    self._watching.add(name)
                self._ensure_watcher()
                return BackendStatus(True)
            recs = self.accounting([name])
        except SlurmError as e:
            # Slurm not answering is not the job ending: keep it running and charged
            self.log.warning("slurm: status of %s unknown (%s); still counted as running",
                             name, e)
            return BackendStatus(True)
        ended = [r for r in recs if r.state not in ALIVE]
        alive = [r for r in recs if r.state in ALIVE]
        if ended and not (alive and not listed):
            rec = max(ended, key=lambda r: r.end or 0)
            self._ended_seen.pop(name, None)
            return BackendStatus(False, exit_status(rec), rec.end)
        if listed or alive:
            # ended in slurmctld, not yet in slurmdbd (or the other way round): wait for
            # the accounting record, which has the exit code and the exact end
            first = self._ended_seen.setdefault(name, time.time())
            if time.time() - first < self.accounting_grace:
                return BackendStatus(True)
            self._ended_seen.pop(name, None)
            end = max((j.end for j in listed if j.end is not None), default=None)
            return BackendStatus(False, None, end)
        sub = self._submitted.get((workload, attempt))
        if sub is not None and time.time() - sub[1] < self.start_grace:
            return BackendStatus(True)
        return BackendStatus(False, launched=False)

    def started(self, workload: str, attempt: int) -> tuple[str, float] | None:
        """The job id and Slurm's start of the attempt's job (squeue's, else sacct's Start),
        once it left PENDING."""
        name = job_name(self.job_name_prefix, workload, attempt)
        try:
            recs = [j for j in self.queue() if j.name == name] or self.accounting([name])
        except SlurmError:
            return None
        ran = [j for j in recs if j.start is not None and j.state != "PENDING"]
        if not ran:
            return None
        first = min(ran, key=lambda j: j.start or 0.0)
        return first.job_id, float(first.start or 0.0)

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        name = job_name(self.job_name_prefix, workload, attempt)
        jobs = self._alive_jobs(name, fresh=True)
        for j in jobs:
            try:
                self._run(["scancel", j.job_id], user=j.user or None)
            except SlurmError as e:
                self.log.warning("slurm: scancel %s: %s", j.job_id, e)
        deadline = time.monotonic() + self.stop_grace
        asked = time.time()
        while jobs and time.monotonic() < deadline:
            time.sleep(0.2)
            asked = time.time()
            jobs = self._alive_jobs(name, fresh=True)
        if jobs:
            self.log.warning("slurm: %s still in Slurm %.0f s after scancel", name,
                             self.stop_grace)
        # when it left the queue: its end, should its accounting record be late (slurmdbd
        # writes a heterogeneous job's components one by one) — the end slurmctld still
        # lists for it, else when the query that found it gone was made (not when that
        # query answered: on a loaded machine squeue takes seconds)
        ends = [j.end for j in self.queue() if j.name == name and j.state not in ALIVE
                and j.end is not None]
        gone_at = max(ends) if ends and not jobs else asked
        st = self.status(workload, attempt)
        while st.alive and time.monotonic() < deadline:  # its accounting record
            time.sleep(0.2)
            with self._lock:
                self._queue = None
            st = self.status(workload, attempt)
        return st if not st.alive else BackendStatus(False, None, gone_at)

    def stop_orphan(self, workload: str, attempt: int) -> None:
        """scancel the attempt's jobs (found by name in squeue) without waiting for them to
        leave: the next cycle's sweep asks again while one is still listed alive."""
        name = job_name(self.job_name_prefix, workload, attempt)
        for j in self._alive_jobs(name, fresh=True):
            if j.state == "COMPLETING":
                continue  # (already ending)
            self._run(["scancel", j.job_id], user=j.user or None)
        with self._lock:
            self._queue = None

    def notify(self, workload: str, attempt: int, signal_name: str) -> str | None:
        """Send the running attempt the signal its job asked for ahead of a likely
        preemption (``warn_signal``): None when sent, else why not (never raised).

        ``scancel --signal=<SIG> --full`` as the job's user: every process of the job (the
        batch step — our script ``exec``s the job's command — its children, and its ``srun``
        steps), as the local backend signals the job's process group and cgroup. Not
        ``--batch``: it reaches the batch step's shell alone, so the processes a script
        starts (with ``srun``: the training processes of most Slurm jobs) never see it, and a
        shell waiting for its child runs its trap only once that child has ended."""
        if signal_name not in WARN_SIGNALS:
            return f"the signal is one of {', '.join(WARN_SIGNALS)}"
        name = job_name(self.job_name_prefix, workload, attempt)
        try:
            jobs = self._alive_jobs(name, fresh=True)
        except SlurmError as e:
            return f"Slurm did not answer: {e}"
        running = [j for j in jobs if j.state == "RUNNING"]
        if not running:
            return f"not running ({jobs[0].state.lower()})" if jobs else "not running"
        errors = []
        for j in running:
            try:
                self._run(["scancel", f"--signal={signal_name}", "--full", j.job_id],
                          user=j.user or None)
            except SlurmError as e:  # (e.g. it ended since squeue listed it)
                errors.append(str(e))
        return "; ".join(errors) or None

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        out = []
        jobs = self.queue(fresh=True)
        try:
            self._sweep_arrays(jobs)
        except Exception:  # noqa: BLE001 - the sweep must not stop the orphans' search
            self.log.exception("slurm: sweeping held array tasks failed")
        try:
            self._sweep_held(jobs)
        except Exception:  # noqa: BLE001 - the sweep must not stop the orphans' search
            self.log.exception("slurm: sweeping held jobs that run after others failed")
        for j in jobs:
            key = parse_job_name(self.job_name_prefix, j.name)
            if key is None or key[1] is None or j.state not in ALIVE:
                continue  # not ours, a session (the hub owns those), or ended
            if (key[0], key[1]) not in running:
                out.append((key[0], key[1]))
        return out

    # ------------------------------------------------------------------ watcher
    def _ensure_watcher(self) -> None:
        with self._lock:
            if self._watcher is not None and self._watcher.is_alive():
                return
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="gpubudget-slurm-watch")
            self._watcher.start()

    def _watch(self) -> None:
        """Notice a job leaving the queue and ask for a cycle (``on_exit``)."""
        while True:
            time.sleep(self.watch_interval)
            with self._lock:
                watching = set(self._watching)
            if not watching:
                continue
            try:
                alive = {j.name for j in self.queue(fresh=True) if j.state in ALIVE}
            except SlurmError as e:
                self.log.debug("slurm watch: %s", e)
                continue
            ended = watching - alive
            if not ended:
                continue
            with self._lock:
                self._watching -= ended
            if self.on_exit is not None:
                try:
                    self.on_exit()
                except RuntimeError:  # the service is shutting down
                    return

    # ------------------------------------------------------------------ nodes
    def discover_inventory(self) -> Any:
        nodes = self.nodes(fresh=True)
        inv = inventory_from_nodes(nodes, self.gpu_models, self.mig_types, self.partition)
        self.log.info("slurm: %d nodes, %d GPUs in partition %s", len(inv.nodes),
                      inv.gpu_count, self.partition)
        return inv

    def node_health(self) -> dict[str, str]:
        nodes = [n for n in self.nodes() if not self.partition or self.partition in n.partitions]
        with self._lock:
            health, self._first_bad = node_health(nodes, self._first_bad, time.time(),
                                                  self.unresponsive_grace)
        return health

    def drain_node(self, node: str, reason: str) -> None:
        if not self.write_drains:
            return
        current = {n.name: n for n in self.nodes(fresh=True)}.get(node)
        if current is None:
            raise SlurmError(f"node {node!r} is not in Slurm")
        if is_drained(current):
            self.log.info("slurm: %s already drained in Slurm (%s); reason kept", node,
                          current.reason or "no reason")
            return
        text = f"{self.job_name_prefix}: {reason}"
        self._run(["scontrol", "update", f"nodename={node}", "state=drain",
                   f"reason={text}"], admin=True)
        with self._lock:
            self._nodes = None
        self.log.warning("slurm: drained %s (%s)", node, text)

    def undrain_node(self, node: str) -> None:
        current = {n.name: n for n in self.nodes(fresh=True)}.get(node)
        if current is None or not is_drained(current):
            return
        if not current.reason.startswith(self.job_name_prefix + ":"):
            self.log.warning("slurm: %s was drained in Slurm by someone else (%s); left "
                             "drained", node, current.reason)
            return
        self._run(["scontrol", "update", f"nodename={node}", "state=resume"], admin=True)
        with self._lock:
            self._nodes = None

    # ------------------------------------------------------------------ usage
    def reconcile_usage(self, intervals: list[tuple[str, int, float, float, str]]
                        ) -> list[dict]:
        """Compare closed intervals (workload, seq, start, end, ledger backend) with sacct.
        Batch jobs of this backend must have a Slurm job; other workloads (sessions) are
        compared when a job named after them exists."""
        if not intervals:
            return []
        names = set()
        for wid, seq, _s, _e, backend in intervals:
            names.add(job_name(self.job_name_prefix, wid, seq if backend == self.name else None))
        recs = self.accounting(sorted(names))
        jobs: dict[str, list[tuple[int | None, JobRecord]]] = {}
        for r in recs:
            key = parse_job_name(self.job_name_prefix, r.name)
            if key is not None:
                jobs.setdefault(key[0], []).append((key[1], r))
        ivs = [Interval(w, s, a, b) for w, s, a, b, backend in intervals
               if backend == self.name or w in jobs]
        return usage_mismatches(ivs, jobs, self.usage_threshold)

    def gpu_busy(self, intervals: list[tuple[str, int, float, float, str]]
                 ) -> list[tuple[str, float, float, float, str]]:
        """Busy samples ``(workload, start, end, fraction, "slurm")`` for the closed intervals
        of finished jobs whose steps Slurm's GPU accounting recorded (sacct's
        ``gres/gpuutil``, ``backends/slurm_gpu.py``); a job without it gives none (its busy
        time stays unknown, never 0)."""
        from .slurm_gpu import SACCT_GPU_FIELDS, parse_gpu_usage

        names: dict[str, tuple[str, float, float]] = {}
        for wid, seq, start, end, backend in intervals:
            names[job_name(self.job_name_prefix, wid, seq if backend == self.name else None)
                  ] = (wid, start, end)
        if not names:
            return []
        out = self._run(["sacct", "-n", "-P", f"--format={SACCT_GPU_FIELDS}",
                         f"--starttime={self.accounting_lookback}", "--endtime=now",
                         f"--name={','.join(sorted(names))}"])
        samples = []
        for u in parse_gpu_usage(out).values():
            got = names.get(u.name)
            if got is not None and u.busy is not None:
                samples.append((got[0], got[1], got[2], u.busy, "slurm"))
        return samples


def _array_output(args: list[str], name: str | None) -> list[str]:
    """``args`` with the output file of a task of a Slurm job array named as a job's is:
    Slurm's ``%j`` is the task's own id (``<array>_<index>``, ``%A_%a``), and ``%x`` (the
    name at submission) the task's own name ``name`` (``%a``: its index) when given."""
    out = []
    for a in args:
        if a.startswith("--output="):
            a = a.replace("%j", "%A_%a")
            if name is not None:
                a = a.replace("%x", name)
        out.append(a)
    return out


# ====================================================================== notebooks


def _parent_of(child: Any) -> Any:
    """The BudgetSpawner wrapping ``child`` (it shares the child's API token)."""
    user = getattr(child, "user", None)
    for s in (getattr(user, "spawners", None) or {}).values():
        if s is not child and getattr(s, "api_token", None) == child.api_token \
                and getattr(s, "child", None) is child:
            return s
    return None


def configure_slurmspawner(child: Any, placement: list[dict], meta: dict) -> None:
    """``BudgetSpawner.child_configurer`` for batchspawner's SlurmSpawner family: the session's
    placement becomes the Slurm request (``c.BudgetSpawner.child_configurer =
    'jupyter_gpubudget.backends.slurm:configure_slurmspawner'``).

    Sets ``req_partition``, ``req_runtime``, ``req_gres`` (first component), ``req_account``
    and ``req_options`` (``--account``, ``--nodelist``, ``--nodes``, job name and comment,
    ``--no-requeue``; a heterogeneous component per further group of nodes). Mapping settings
    are read from ``c.SlurmBackend`` in the hub's configuration."""
    cfg = SlurmBackend(config=getattr(child, "config", None), log=child.log)
    comps = components(placement, cfg.gpu_type, cfg.mig_types)
    t = cfg.session_time_limit or job_time(None, float(meta.get("min_runtime") or 0),
                                           cfg.time_headroom, cfg.default_time)
    account = cfg.account_for(str(meta["project"]))
    session = str(meta["session"])
    head = [f"--account={account}", f"--job-name={job_name(cfg.job_name_prefix, session)}",
            f"--comment=gpubudget:{session}:session:{meta['project']}", "--no-requeue"]

    def comp_opts(c: Any) -> list[str]:
        opts = [f"--nodes={len(c.nodes)}", f"--nodelist={','.join(c.nodes)}",
                "--ntasks-per-node=1"]  # one server, not one per GPU
        if c.mem_mib:
            opts.append(f"--mem={c.mem_mib}M")
        return opts

    first = comps[0]
    lines = [" ".join(head + comp_opts(first))]
    for c in comps[1:]:
        opts = [f"--partition={cfg.partition}", f"--account={account}",
                f"--time={slurm_time(t)}", *comp_opts(c)]
        if c.gres:
            opts.append(f"--gres={c.gres}")
        lines += ["hetjob", " ".join(opts)]
    child.req_partition = cfg.partition
    child.req_runtime = slurm_time(t)
    child.req_gres = first.gres
    child.req_account = account
    child.req_options = "\n#SBATCH ".join(lines)
    if len(first.nodes) > 1 and getattr(child, "req_srun", "") == "srun":
        child.req_srun = "srun --nodes=1 --ntasks=1"  # the server runs once, on the first node
    env = {k: v for k, v in (meta.get("env") or {}).items() if k not in SLURM_SETS}
    child.environment = {**child.environment, **env}
    _forward_port(child)


def _forward_port(child: Any) -> None:
    """batchspawner-singleuser reports its port to the hub, which sets it on the spawner that
    owns the server's token: the wrapping BudgetSpawner. Pass it on to the SlurmSpawner,
    whose start() waits for it."""
    parent = _parent_of(child)
    if parent is None or getattr(child, "_gpubudget_port_forward", False):
        return

    def forward(change: dict, child: Any = child) -> None:
        if change["new"] and change["new"] != child.port:
            child.port = change["new"]

    parent.observe(forward, "port")
    child._gpubudget_port_forward = True



# ====================================================================== accounts


def sync_accounts(backend: SlurmBackend, tree: Any, *, prune: bool = False,
                  dry_run: bool = False) -> tuple[Any, list[list[str]]]:
    """Mirror the budgets tree into slurmdbd below ``backend.root_account``: an account per
    program/project, an association per (member, project). Returns the plan and the sacctmgr
    commands (run unless ``dry_run``)."""
    from .slurm_map import account_plan, parse_sacctmgr_accounts, parse_sacctmgr_users

    out = backend._run(["sacctmgr", "-n", "-P", "show", "associations",
                        "format=Account,ParentName,User"], admin=True)
    plan = account_plan(tree, parse_sacctmgr_accounts(out), parse_sacctmgr_users(out),
                        root=backend.root_account, mapping=backend.account_map, prune=prune)
    cmds = plan.commands()
    if not dry_run:
        for args in cmds:
            backend._run(["sacctmgr", *args], admin=True)
    return plan, cmds
