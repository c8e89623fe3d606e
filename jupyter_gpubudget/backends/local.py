"""Local backend: a batch job's command runs on this machine as the submitting user's Unix
account, started by the privileged launcher (``jupyter_gpubudget.launcher``).

The placement becomes the job's devices through the one builder (``backends/devices.py``):
``CUDA_VISIBLE_DEVICES`` = ``GPU-<uuid>`` / ``MIG-<uuid>`` from the service's NVML inventory
(derived stand-ins for a declared one, logged once), and for MPS shares the MPS variables.
The launcher keeps each attempt's records in ``<jobs root>/<workload>/<attempt>/`` (pid,
exit, output.log); jobs survive a restart of the service and are found again there.

How the launcher runs (``isolation``):

- ``sudo``: the service is an unprivileged user and ``launcher_config`` names the launcher's
  root-owned config; the launcher runs through ``sudo -n`` (docs/service.md has the sudoers
  line). Jobs run as their users; the service cannot become root.
- ``root``: the service itself is root; the launcher runs directly. Jobs still run as their
  users, but the service's own compromise is root's.
- ``off``: neither: the launcher runs as the service's user and so do all jobs (a developer's
  machine). The log says so loudly.

Containment: the launcher runs every attempt in its own cgroup (``launcher/cgroups.py``) and
an attempt has ended only when its cgroup is empty, whatever its processes did with sessions
and process groups. When the launcher's monitor of an attempt is gone (killed), the cgroup
alone says whether it still runs: it is charged until it is found empty, and its exit code is
recorded as unknown.

Transparent checkpoints (``checkpoint_store`` set): a ``resumable`` job without a checkpoint
of its own (``checkpoint: auto``, the default for resumable jobs) is not signalled when it is
preempted: the launcher dumps its process tree with the CRIU helper, its images go into the
snapshot store, the tree is ended, and the requeued attempt (on whichever node takes it) is
restored from them instead of starting its command again. A job that cannot be dumped falls
back to SIGTERM, grace, SIGKILL and a fresh start; its log says why. ``checkpoint: self``
keeps the signal (the job saves its own progress).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import selectors
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from traitlets import Bool, Dict, Float, Integer, List, Unicode

from jupyter_gpubudget.core.inventory import Inventory
from jupyter_gpubudget.launcher import cgroups
from jupyter_gpubudget.launcher.policy import DEFAULT_JOB_PATH
from jupyter_gpubudget.launcher.records import proc_starttime, read_record

from . import devices as dev
from .base import Backend, BackendStatus, Launch, LogChunk, job_identity_env
from .mps import CONTROL, LauncherMps, MpsDaemons, MpsUnavailable

#: how a job's checkpoint mode reaches the backend (service/validate.py puts it in the job's
#: env) and the job (the launcher sets it): ``auto`` or ``self``
CHECKPOINT_ENV = "GPUBUDGET_CHECKPOINT"
#: the signal a job asked for ahead of a likely preemption (``warn_signal``; the launcher's
#: ``notify`` sends it)
WARN_ENV = "GPUBUDGET_WARN_SIGNAL"
WARN_SIGNALS = ("USR1", "USR2", "INT", "TERM", "HUP")
#: ended attempts remembered as released (their ends are reported a few times at most)
RELEASED_KEPT = 4096


#: what a task of a job array is told (the service puts them in the task's env)
ARRAY_ENV = ("GPUBUDGET_ARRAY_INDEX", "GPUBUDGET_ARRAY_ID")


class CommandError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


class LocalBackend(Backend):
    name = "local"
    #: attempts found ended (with their exit record) by :meth:`orphans`: not read again
    _ended_attempts: set[tuple[str, int]] | None = None

    state_dir = Unicode("gpubudget-jobs", help="Directory holding one folder per job attempt "
                        "(pid, exit record, output.log). With launcher_config, the config's "
                        "jobs_root is used instead.").tag(config=True)
    stop_grace = Float(10.0, help="Seconds between SIGTERM and SIGKILL when a job is stopped "
                       "(preemption, cancel, time limit).").tag(config=True)
    start_grace = Float(5.0, help="Seconds an attempt directory without a pid file counts as "
                        "starting (a launch interrupted by a service restart).").tag(config=True)
    extra_env = Dict({}, help="Extra environment variables for every job. The names a job may "
                     "not set are refused here too; loader variables an admin needs "
                     "(LD_LIBRARY_PATH) go in the launcher config's 'env'.").tag(config=True)
    gpu_uuids = Dict({}, help="Map 'node/index' to the GPU UUID put in CUDA_VISIBLE_DEVICES, "
                     "for a declared inventory on a machine that has the GPUs (an NVML "
                     "inventory knows its UUIDs; without either, jobs get derived ids that "
                     "are not CUDA ids).").tag(config=True)
    mps_state_dir = Unicode("gpubudget-mps", help="Directory of the MPS control daemons the "
                            "backend runs, one per GPU carrying MPS shares of jobs "
                            "(<dir>/<gpu id>/pipe and /log). Only for an NVML inventory: a "
                            "declared one has no real GPUs to run them for.").tag(config=True)
    mps_control = Unicode(CONTROL, help="The MPS control program (a name on the service's "
                          "PATH, or a path). When it or the NVIDIA driver is missing, a job on "
                          "an MPS share fails to start with a message saying so.").tag(config=True)
    mps_check_interval = Float(10.0, help="Seconds between checks that the MPS control daemon "
                               "of a GPU with running shares still answers (it is started "
                               "again when it died).").tag(config=True)
    allowed_commands = List(Unicode(), [], help="Regular expressions; when set, a job is "
                            "accepted only if its command fully matches one: the shell string "
                            "of a string command, or the argv joined by spaces with the "
                            "program resolved to its absolute path on the job PATH (e.g. "
                            "'/usr/bin/python3 train\\.py( .*)?'). Empty: any command."
                            ).tag(config=True)

    launcher_config = Unicode("", help="Path of the launcher's config file (JSON, owned by "
                              "root: jobs_root, group, min_uid, path, env, workdir, umask). "
                              "When set and the service is not root, the launcher runs through "
                              "'sudo -n' (see 'Security model' in docs/service.md)."
                              ).tag(config=True)
    launcher_sudo = Bool(True, help="Run the launcher through 'sudo -n' when the service is not "
                         "root and launcher_config is set.").tag(config=True)
    launcher_python = Unicode(sys.executable, help="The Python that runs the launcher (the one "
                              "named in the sudoers line).").tag(config=True)
    unix_user_template = Unicode("{username}", help="The Unix account a hub user's jobs run "
                                 "as; {username} is the JupyterHub user name (as "
                                 "LocalProcessSpawner does). unix_users overrides it per user."
                                 ).tag(config=True)
    unix_users = Dict({}, help="Hub user name -> Unix account, for users whose account is not "
                      "given by unix_user_template.").tag(config=True)
    min_uid = Integer(1000, help="Jobs never run as an account with a smaller uid (root, "
                      "system accounts). The launcher config's min_uid is used when given."
                      ).tag(config=True)
    cgroup_root = Unicode("", help="The cgroup v2 directory under which each job attempt gets "
                          "its own cgroup (job.<workload>.<attempt>); empty: 'gpubudget' under "
                          "the cgroup2 mount found in /proc/self/mountinfo. With "
                          "launcher_config, the config's 'cgroup_root' is used instead. Where "
                          "no cgroup can be made there, jobs do not start (the error says "
                          "why).").tag(config=True)
    contain = Bool(True, help="Run every job in its own cgroup, and count it ended only when "
                   "the cgroup is empty. False is UNSAFE: a job's processes that leave its "
                   "process group (setsid, double fork) then keep running, as the user, on a "
                   "GPU given to someone else. With launcher_config, the config's 'contain' "
                   "is used instead.").tag(config=True)
    job_path = Unicode("", help="The PATH of a job, and where a program named without a path is "
                       "looked up before allowed_commands is checked. Default: the launcher "
                       f"config's 'path', else {DEFAULT_JOB_PATH}.").tag(config=True)

    checkpoint_store = Unicode("", help="Directory of the snapshot store for transparent "
                                "checkpoints of batch jobs (checkpoint: auto): shared by the "
                                "nodes a requeued job may land on. Empty: none; preempted jobs "
                                "are signalled and start again.").tag(config=True)
    checkpoint_timeout = Float(600.0, help="Seconds a job's dump may take before it is "
                               "signalled instead.").tag(config=True)

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)
        self._cfg: dict = {}
        #: (workload, attempt) -> (checkpoint mode, project) of the attempts launched here
        self._modes: dict[tuple[str, int], tuple[str, str]] = {}
        #: (workload, attempt) -> why its stop fell back from a checkpoint to the signal
        self._fell_back: dict[tuple[str, int], str] = {}
        #: (workload, attempt) -> the snapshot its stop checkpointed it into
        self._took: dict[tuple[str, int], str] = {}
        self._checkpoints = None
        if self.checkpoint_store:
            from jupyter_gpubudget.snapshot.jobsnap import JobCheckpoints
            from jupyter_gpubudget.snapshot.store import Store

            self._checkpoints = JobCheckpoints(Store(self.checkpoint_store, parent=self))
        if self.launcher_config:
            try:
                self._cfg = json.loads(Path(self.launcher_config).read_text())
            except (OSError, ValueError) as e:
                raise OSError(f"LocalBackend.launcher_config {self.launcher_config}: {e}") \
                    from None
        self.jobs_root = Path(self._cfg.get("jobs_root") or self.state_dir).absolute()
        if os.geteuid() == 0:
            self.isolation = "root"
        elif self.launcher_config and self.launcher_sudo:
            self.isolation = "sudo"
        else:
            self.isolation = "off"
        self._records_uid = 0 if self.isolation in ("root", "sudo") else os.geteuid()
        self._watch = _ExitWatch(self)
        self._declared_told = False
        self.use_inventory(None)
        # jobs of other users (root / sudo isolation) reach the daemon's pipe directory, and
        # only a root daemon starts their MPS servers: under sudo the launcher runs it
        self.mps: MpsDaemons | LauncherMps
        if self.isolation == "sudo":
            self.mps = LauncherMps(self._launcher)
        else:
            self.mps = MpsDaemons(self.mps_state_dir, self.mps_control,
                                  other_users=self.isolation != "off", logger=self.log)
        self._mps_checked: dict[str, float] = {}  # holder -> when its daemons were checked
        self._mps_holders: set[str] = set()  # attempts holding daemons (started here)
        self._mig_holders: set[str] = set()  # attempts MIG instances were created for
        # attempts whose devices were given back (so the launcher is not asked twice); an
        # attempt's end is seen a few times at most, so the last RELEASED_KEPT are enough
        self._released: dict[str, None] = {}
        if self.isolation == "off":
            self.log.warning(
                "LocalBackend: isolation is OFF: the service is not root and has no launcher "
                "config, so batch jobs run as %s, the service's own Unix user. Fine on a "
                "developer's machine, never on a shared one (see 'Security model' in "
                "docs/service.md).", pwd.getpwuid(os.geteuid()).pw_name)
        elif self.isolation == "root":
            self.log.warning(
                "LocalBackend: the service runs as root. Jobs run as their users' accounts "
                "through the launcher, but run the service as an unprivileged user with a sudo "
                "launcher on a shared machine (see 'Security model' in docs/service.md).")
        else:
            self.log.info("LocalBackend: jobs run as their users' accounts through "
                          "'sudo -n %s -I -m jupyter_gpubudget.launcher --config %s'",
                          self.launcher_python, self.launcher_config)

    def use_inventory(self, inventory: Inventory | None) -> None:
        overrides: dict[tuple[str, int], str] = {}
        for key, uuid in self.gpu_uuids.items():
            node, _, idx = str(key).rpartition("/")
            if not node or not idx.isdigit():
                raise ValueError(f"LocalBackend.gpu_uuids: key {key!r} is not 'node/index'")
            overrides[(node, int(idx))] = str(uuid)
        self.devices = dev.device_map(inventory, overrides)

    def job_devices(self, placement: list[dict], holder: str | None = None) -> dict[str, str]:
        """The job's device environment (see ``backends/devices.py``). With ``holder`` (the
        attempt): MIG slices with no instance yet (``dynamic_mig``) are created through the
        launcher, and MPS shares on real GPUs hold their GPU's MPS control daemon (started
        for the first share); ``release_devices`` undoes both. All or nothing: what was
        taken is given back when a step fails."""
        devices = self.devices
        if holder is not None:
            self._released.pop(holder, None)
            devices = self._carve(placement, holder)
        try:
            built = dev.build(placement, devices)
            if built.declared and not self._declared_told:
                self._declared_told = True
                self.log.warning("LocalBackend: %s", dev.DECLARED_NOTE)
            if holder is None or not built.mps_gpus or built.declared:
                return built.env
            try:
                dev.build(placement, devices, dict.fromkeys(built.mps_gpus, "-"))  # one GPU
                pipes = self.mps.acquire_all(holder, list(built.mps_gpus))
                self._mps_holders.add(holder)
            except MpsUnavailable as e:
                raise MpsUnavailable(f"MPS share on {', '.join(built.mps_gpus)}: {e}") \
                    from None
            return dev.build(placement, devices, pipes).env
        except BaseException:
            if holder is not None:
                self._destroy_carved(holder)
            raise

    def _carve(self, placement: list[dict], holder: str) -> dev.DeviceMap:
        """Create the placement's MIG instances that do not exist yet (dynamic_mig)."""
        carves = dev.to_carve(placement, self.devices)
        if not carves:
            return self.devices
        created: dict[tuple[str, int, str, int], str] = {}
        for c in carves:
            try:
                out = self._launcher("mig-create", holder, c.gpu_uuid, c.profile, str(c.start),
                                     str(c.size))
            except RuntimeError as e:
                self._destroy_carved(holder)
                raise dev.DeviceError(f"MIG {c.profile} at slot {c.start} of {c.gpu_uuid}: "
                                      f"{e}") from None
            created[c.key] = str(out.get("uuid"))
            self._mig_holders.add(holder)
            self.log.info("MIG instance %s %s created for %s (dynamic_mig)", c.profile,
                          created[c.key], holder)
        return dev.with_migs(self.devices, created)

    def _destroy_carved(self, holder: str) -> bool:
        """Destroy the MIG instances created for ``holder``; False when some are left (still
        in use: a later end check tries again)."""
        if holder not in self._mig_holders and not self.devices.carvable:
            return True
        try:
            out = self._launcher("mig-destroy", holder)
        except RuntimeError as e:
            self.log.error("MIG instances of %s: %s", holder, e)
            return False
        self._mig_holders.discard(holder)
        if out.get("destroyed"):
            self.log.info("MIG instances of %s destroyed: %s", holder,
                          ", ".join(out["destroyed"]))
        return True

    def release_devices(self, workload: str, attempt: int) -> None:
        """The attempt has ended: destroy the MIG instances created for it and let go of the
        MPS daemons it held. Idempotent, and done once per attempt (through the launcher,
        whose records are root's to read); an instance still in use is tried again at the
        next check."""
        holder = f"{workload}.{attempt}"
        if holder in self._released:
            return
        self._mps_checked.pop(holder, None)
        done = self._destroy_carved(holder)
        try:
            self.mps.release(holder)
            self._mps_holders.discard(holder)
        except RuntimeError as e:
            self.log.error("MPS daemons of %s: release failed: %s", holder, e)
            done = False
        if done:
            self._released[holder] = None
            if len(self._released) > RELEASED_KEPT:  # a long-running service: the oldest go
                del self._released[next(iter(self._released))]

    def _supervise_mps(self, workload: str, attempt: int) -> None:
        """Start again, at most every mps_check_interval, a daemon this running attempt holds
        that died (under sudo: the attempts this service started shares for)."""
        holder = f"{workload}.{attempt}"
        if isinstance(self.mps, LauncherMps) and holder not in self._mps_holders:
            return
        now = time.monotonic()
        if now - self._mps_checked.get(holder, float("-inf")) < self.mps_check_interval:
            return
        self._mps_checked[holder] = now
        try:
            self.mps.ensure_held(holder)
        except (MpsUnavailable, RuntimeError) as e:
            self.log.error("MPS control daemon of %s: %s", holder, e)

    # ------------------------------------------------------------------ who and what
    @property
    def path(self) -> str:
        return self.job_path or self._cfg.get("path") or DEFAULT_JOB_PATH

    def unix_user(self, user: str) -> str:
        """The Unix account ``user``'s jobs run as."""
        if self.isolation == "off":
            return pwd.getpwuid(os.geteuid()).pw_name
        return self.unix_users.get(user) or self.unix_user_template.format(username=user)

    def check_user(self, user: str) -> str | None:
        if self.isolation == "off":
            return None
        name = self.unix_user(user)
        try:
            pw = pwd.getpwnam(name)
        except (KeyError, ValueError):
            return (f"hub user {user!r} has no Unix account {name!r} on the service's machine, "
                    "so their batch jobs cannot run here; ask an admin "
                    "(LocalBackend.unix_user_template / unix_users)")
        min_uid = max(1, int(self._cfg.get("min_uid", self.min_uid)))
        if pw.pw_uid == 0:
            return f"hub user {user!r} maps to root ({name!r}); jobs never run as root"
        if pw.pw_uid in (65534, 4294967294, 4294967295) or pw.pw_name in self._cfg.get(
                "denied_users", ["nobody", "nfsnobody"]):
            return f"hub user {user!r} maps to {name!r}, which may not run jobs"
        if pw.pw_uid < min_uid:
            return (f"hub user {user!r} maps to the system account {name!r} (uid {pw.pw_uid} < "
                    f"{min_uid}); jobs never run as a system account")
        return None

    def resolve_command(self, command: list[str]) -> list[str]:
        """The command with its program as an absolute path (a name is looked up on the job
        PATH): what allowed_commands is matched against and what the launcher runs."""
        prog = command[0]
        if os.path.isabs(prog):
            return [os.path.normpath(prog), *command[1:]]
        if "/" in prog:
            raise CommandError("command[0]", f"{prog!r} is a relative path; give a program on "
                               "the job PATH or an absolute path")
        found = shutil.which(prog, path=self.path)
        if found is None:
            raise CommandError("command[0]", f"{prog!r} is not found on the job PATH "
                               f"({self.path})")
        return [os.path.normpath(found), *command[1:]]

    def check_command(self, command: list[str]) -> str | None:
        """None if the command may run here, else the reason it may not."""
        if not self.allowed_commands:
            return None
        if command[:2] == ["/bin/sh", "-c"] and len(command) == 3:
            text = command[2]
        else:
            try:
                text = " ".join(self.resolve_command(command))
            except CommandError as e:
                return e.message
        if any(re.fullmatch(p, text) for p in self.allowed_commands):
            return None
        return "not allowed on this service (see LocalBackend.allowed_commands)"

    # ------------------------------------------------------------------ the launcher
    def _launcher(self, verb: str, *args: str, spec: dict | None = None,
                  timeout: float = 60.0) -> dict:
        cmd = [self.launcher_python, "-I", "-m", "jupyter_gpubudget.launcher"]
        if self.isolation == "sudo":
            cmd = ["sudo", "-n", *cmd]
        if self.launcher_config:
            cmd += ["--config", self.launcher_config]
        else:
            cmd += ["--jobs-root", str(self.jobs_root)]
            if self.job_path:
                cmd += ["--path", self.job_path]
            if self.cgroup_root:
                cmd += ["--cgroup-root", self.cgroup_root]
            if not self.contain:
                cmd += ["--no-contain"]
        cmd += [verb, *args]
        # the launcher builds the job's environment itself; it gets none of the service's
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        proc = subprocess.run(cmd, input=json.dumps(spec or {}).encode(), capture_output=True,
                              timeout=timeout, env=env, cwd="/")
        try:
            out = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            out = {"error": (proc.stderr or proc.stdout).decode(errors="replace").strip()[-2000:]
                   or f"exit status {proc.returncode}"}
        if proc.returncode != 0 or "error" in out:
            raise RuntimeError(f"launcher {verb}: {out.get('error')}")
        return out

    def launch(self, launch: Launch) -> str:
        holder = f"{launch.workload}.{launch.attempt}"
        job_env = self.job_devices(launch.placement, holder)
        job_env.update({**job_identity_env(launch),
                        "GPUBUDGET_PLACEMENT": json.dumps(launch.placement)})
        # a task of a job array: its index and array, set by the service at submission
        # (a job's own env may not set GPUBUDGET_*: they go with the service's variables)
        env = dict(launch.env)
        job_env.update({k: env.pop(k) for k in ARRAY_ENV if k in env})
        mode = env.pop(CHECKPOINT_ENV, None) or "auto"
        if not launch.resumable or mode not in ("auto", "self"):
            mode = "self"
        job_env[CHECKPOINT_ENV] = mode
        warn = env.pop(WARN_ENV, None)  # the signal it asked for ahead of a preemption
        if warn in WARN_SIGNALS:
            job_env[WARN_ENV] = warn
        spec = {"workload": launch.workload, "attempt": launch.attempt,
                "user": self.unix_user(launch.user),
                "command": self.resolve_command(list(launch.command)),
                "env": {**self.extra_env, **env}, "job_env": job_env,
                "time_limit": launch.time_limit, "grace": self.stop_grace}
        if self.fence_token is not None:  # a stale replica's launch is refused
            spec["fence"] = self.fence_token
        restoring = False
        if mode == "auto" and self._checkpoints is not None:
            try:
                got = self._checkpoints.take(launch.workload)
            except Exception as e:  # noqa: BLE001 - a bad checkpoint: the job starts afresh
                self.log.error("%s: its checkpoint cannot be used (%s); it starts again",
                               launch.workload, e)
                got = None
            if got is not None:  # the launcher reads its images from the store's chunks
                restoring = True
                spec["restore"] = {**got[1], "log": got[2]["log"],
                                   "gpu": bool(got[2].get("gpu"))}
        try:
            out = self._launcher("launch", spec=spec)
        except BaseException:
            self.release_devices(launch.workload, launch.attempt)
            raise
        if restoring and self._checkpoints is not None:
            self._checkpoints.drop(launch.workload)  # restored (or started again: its log says)
        self._modes[(launch.workload, launch.attempt)] = (mode, launch.project)
        self._watch.add(int(out["monitor_pid"]))
        self.log.info("launched %s attempt %d as %s, pid %s", launch.workload, launch.attempt,
                      out.get("user"), out["pid"])
        return str(out["pid"])

    def fence(self, token: int | None) -> None:
        """Raise the launcher's fence to ``token`` (waits for a launch under way): a replica
        that no longer leads cannot start a job on this node any more."""
        self.fence_token = token
        if token is not None:
            self._launcher("fence", str(token))

    def _dir(self, workload: str, attempt: int) -> Path:
        return self.jobs_root / workload / str(attempt)

    def pids(self, workload: str, attempt: int) -> frozenset[int] | None:
        """The attempt's processes (its cgroup's, else its recorded pid), for the busy
        sampler's per-process utilisation of MPS shares; None when not known."""
        pid = read_record(self._dir(workload, attempt) / "pid", self._records_uid)
        if pid is None:
            return None
        cg = pid.get("cgroup")
        if isinstance(cg, str) and cg:
            try:
                return frozenset(cgroups.parse_procs(
                    (Path(cg) / "cgroup.procs").read_text()))
            except OSError:
                return None
        p = pid.get("pid")
        return frozenset((p,)) if isinstance(p, int) and p > 1 else None

    def started(self, workload: str, attempt: int) -> tuple[str, float] | None:
        """The job's pid and when the launcher started it (its ``pid`` record)."""
        rec = read_record(self._dir(workload, attempt) / "pid", self._records_uid)
        at = rec.get("launched_at") if rec is not None else None
        if rec is None or not isinstance(at, (int, float)) or isinstance(at, bool):
            return None
        return str(rec.get("pid")), float(at)

    def status(self, workload: str, attempt: int) -> BackendStatus:
        st = self._status(workload, attempt)
        if st.alive:
            self._supervise_mps(workload, attempt)
        elif st.launched:
            self.release_devices(workload, attempt)
        return st

    def _status(self, workload: str, attempt: int) -> BackendStatus:
        d = self._dir(workload, attempt)
        rec = read_record(d / "exit", self._records_uid)
        if rec is not None:
            return BackendStatus(False, rec.get("exit_code"), rec.get("ended_at"),
                                 timed_out=bool(rec.get("timed_out")),
                                 unsupervised=bool(rec.get("monitor_lost")))
        pid = read_record(d / "pid", self._records_uid)
        if pid is not None:
            m = pid.get("monitor_pid")
            if isinstance(m, int) and m > 1 and proc_starttime(m) == pid.get("monitor_start"):
                return BackendStatus(True)  # its monitor writes the exit record
            cg = pid.get("cgroup")
            if isinstance(cg, str) and cg:
                return self._unsupervised(workload, attempt, cg)
            p = pid.get("pid")  # uncontained (an older launcher, or contain off)
            if isinstance(p, int) and p > 1 and proc_starttime(p) == pid.get("start"):
                return BackendStatus(True)
            return BackendStatus(False)  # ended without an exit record: lost
        try:
            age = time.time() - d.stat().st_mtime
        except OSError:
            return BackendStatus(False, launched=False)
        if age < self.start_grace:
            return BackendStatus(True)  # launched moments before a restart: not known yet
        return BackendStatus(False)

    def _unsupervised(self, workload: str, attempt: int, cg: str) -> BackendStatus:
        """The attempt's monitor is gone (killed): it runs while its cgroup holds a process.
        Once it is empty, the launcher writes the exit record (exit code unknown) and
        removes the cgroup; until it has, the end is when it was found empty."""
        try:
            if cgroups.populated(cg):
                return BackendStatus(True, unsupervised=True)
        except OSError as e:  # unknown: the slice stays held until it can be read
            self.log.error("%s attempt %d: its monitor is gone and its cgroup %s cannot be "
                           "read (%s); it counts as running (the cgroup root must be "
                           "readable by the service)", workload, attempt, cg, e)
            return BackendStatus(True, unsupervised=True)
        seen = time.time()
        try:
            out = self._launcher("signal", workload, str(attempt), f"{self.stop_grace:g}",
                                 timeout=self.stop_grace + 60)
            rec = out.get("exit") or {}
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            self.log.error("settling %s attempt %d (its monitor is gone): %s", workload,
                           attempt, e)
            rec = {}
        return BackendStatus(False, rec.get("exit_code"), rec.get("ended_at") or seen,
                             timed_out=bool(rec.get("timed_out")), unsupervised=True)

    def _checkpoint(self, workload: str, attempt: int) -> bool:
        """Dump a ``checkpoint: auto`` attempt into the store and end it; False when it was
        not (the launcher wrote why into the job's log): then it is signalled as before."""
        mode, project = self._modes.get((workload, attempt), ("self", ""))
        if mode != "auto" or self._checkpoints is None:
            return False
        try:
            out = self._launcher("checkpoint", workload, str(attempt),
                                 timeout=self.checkpoint_timeout + 60)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            self.log.error("checkpointing %s attempt %d: %s", workload, attempt, e)
            self._fell_back[(workload, attempt)] = f"the checkpoint failed ({e})"
            return False
        if not out.get("checkpointed"):
            self.log.warning("%s attempt %d not checkpointed: %s; signalled instead", workload,
                             attempt, out.get("reason"))
            self._fell_back[(workload, attempt)] = str(out.get("reason") or "refused")
            return False
        images = str(out["images_dir"])
        try:
            sid = self._checkpoints.save(workload, project, images, {
                "log": out["log"], "gpu": bool(out.get("gpu")), "attempt": attempt,
                "dump_seconds": out.get("seconds")})
        except Exception as e:  # noqa: BLE001 - not stored: it goes on, then is signalled
            self.log.error("%s attempt %d: its checkpoint could not be stored (%s); "
                           "signalled instead", workload, attempt, e)
            self._fell_back[(workload, attempt)] = f"its checkpoint could not be stored ({e})"
            self._launcher("checkpoint-end", workload, str(attempt), "resume")
            return False
        finally:
            shutil.rmtree(images, ignore_errors=True)
        self._launcher("checkpoint-end", workload, str(attempt), "kill",
                       timeout=self.stop_grace + 60)
        self._took[(workload, attempt)] = sid
        self.log.info("%s attempt %d checkpointed (snapshot %s, %s bytes, dump %.2f s)",
                      workload, attempt, sid, out.get("bytes"), out.get("seconds") or 0.0)
        return True

    def checkpoint_fallback(self, workload: str, attempt: int) -> str | None:
        """Why the last stop of a ``checkpoint: auto`` attempt was not a checkpoint (it was
        signalled, and starts again from its command), once; None when it was one."""
        return self._fell_back.pop((workload, attempt), None)

    def checkpoint_taken(self, workload: str, attempt: int) -> str | None:
        """The snapshot the last stop of the attempt checkpointed it into (it resumes from it
        where it stopped), once; None when it was not checkpointed."""
        return self._took.pop((workload, attempt), None)

    def stop(self, workload: str, attempt: int) -> BackendStatus:
        if self.status(workload, attempt).alive and self._checkpoint(workload, attempt):
            st = self.status(workload, attempt)
            return st if not st.alive else BackendStatus(False)
        if self.status(workload, attempt).alive:
            try:
                self._launcher("signal", workload, str(attempt), f"{self.stop_grace:g}",
                               timeout=self.stop_grace + 60)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                self.log.error("stopping %s attempt %d: %s", workload, attempt, e)
        st = self.status(workload, attempt)
        return st if not st.alive else BackendStatus(False)

    def notify(self, workload: str, attempt: int, signal_name: str) -> str | None:
        """Send the running attempt the signal its job asked for ahead of a likely
        preemption (``warn_signal``; the launcher's ``notify``): None when sent, else why
        not."""
        try:
            out = self._launcher("notify", workload, str(attempt), signal_name)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            return str(e)
        return None if out.get("notified") else str(out.get("reason") or "not sent")

    def read_log(self, workload: str, attempt: int, offset: int, limit: int) -> LogChunk | None:
        """From the attempt's ``output.log`` (a regular file only: a link or a pipe put there
        by the job is not followed)."""
        path = self._dir(workload, attempt) / "output.log"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return LogChunk(b"", 0, 0)
        except OSError as e:
            raise OSError(f"the job's output cannot be read ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise OSError("the job's output.log is not a regular file")
            size = st.st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(max(0, min(limit, size - start)))
        return LogChunk(data, start, size)

    def orphans(self, running: set[tuple[str, int]]) -> list[tuple[str, int]]:
        """Attempt directories whose job still runs and that ``running`` does not hold. Called
        every scheduling cycle: an attempt once found ended (it has its exit record) is not
        read again."""
        out: list[tuple[str, int]] = []
        root = self.jobs_root
        if not root.is_dir():
            return out
        if self._ended_attempts is None:
            self._ended_attempts = set()
        ended = self._ended_attempts
        for wdir in root.iterdir():
            for adir in wdir.iterdir() if wdir.is_dir() else ():
                if not adir.name.isdigit():
                    continue
                key = (wdir.name, int(adir.name))
                if key in running or key in ended:
                    continue
                st = self.status(*key)
                if st.alive:
                    out.append(key)
                elif st.launched and (adir / "exit").exists():
                    ended.add(key)
        return out


class _ExitWatch:
    """One thread waiting on the pidfds of the jobs' monitors: when one ends, the backend's
    ``on_exit`` runs (the service then runs a cycle at once instead of at the next timer)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return  # already gone: the next cycle sees its exit record
        with self.lock:
            self.sel.register(fd, selectors.EVENT_READ, pid)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="gpubudget-job-exits")
                self.thread.start()
        os.write(self.wake_w, b"x")

    def _run(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    os.read(self.wake_r, 4096)
                    continue
                with self.lock:
                    self.sel.unregister(key.fd)
                os.close(key.fd)
                if self.backend.on_exit is not None:
                    try:
                        self.backend.on_exit()
                    except RuntimeError:  # the service is shutting down
                        pass
