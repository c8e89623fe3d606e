"""The launcher's configuration: a small JSON file owned by root (when the launcher runs as
root), named by the sudoers line, never by the job spec::

    {
      "jobs_root": "/var/lib/gpubudget/jobs",  # the only place the launcher writes
      "group": "gpubudget",                     # the service's group: may read job records
      "min_uid": 1000,                          # no job runs as root or a system account
      "allowed_groups": [],                     # if given: the job's user must be in one
      "denied_users": ["nobody"],               # never these (nor uid 65534)
      "path": "/usr/local/bin:/usr/bin:/bin",   # the job's PATH
      "env": {},                                # the admin's variables for every job
      "workdir": "{home}",                      # where a job starts ({home}, {user},
                                                #  {workload}, {attempt}); made as the user
      "umask": "0077",                          # the job's umask
      "mps_root": "/var/lib/gpubudget/mps",     # MPS control daemons' directories
      "mps_control": "/usr/bin/nvidia-cuda-mps-control",
      "mps_driver_probe": "/proc/driver/nvidia/version", # present when a driver is loaded
      "dynamic_mig": false,                     # may MIG instances be created for work
      "mig_root": "/var/lib/gpubudget/mig",     # which instances the launcher created
      "cgroup_root": "",                        # the jobs' cgroups (launcher/cgroups.py);
                                                #  "": gpubudget under the cgroup2 mount
      "contain": true                           # false: no cgroups (UNSAFE: a job's processes
                                                #  that leave its process group outlive it)
    }

``mps_root`` and ``mig_root`` default to ``mps`` and ``mig`` beside the jobs root.

Without a file (``--jobs-root DIR``) the defaults apply; that form is for a service that
runs as root itself or, unprivileged, on a developer's machine (no isolation).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .policy import DEFAULT_JOB_PATH, ENV_KEY, bad_text

KEYS = {"jobs_root", "group", "min_uid", "allowed_groups", "denied_users", "path", "env",
        "workdir", "umask", "max_grace", "mps_root", "mps_control", "mps_driver_probe",
        "dynamic_mig", "mig_root", "cgroup_root", "contain"}

MPS_CONTROL = "/usr/bin/nvidia-cuda-mps-control"
DRIVER_PROBE = "/proc/driver/nvidia/version"


class LauncherError(Exception):
    """A refusal: printed as ``{"error": ...}`` and exit status 2; nothing was started."""


@dataclass(frozen=True)
class LauncherConfig:
    jobs_root: Path
    group: str = ""
    min_uid: int = 1000
    allowed_groups: tuple[str, ...] = ()
    denied_users: tuple[str, ...] = ("nobody", "nfsnobody")
    path: str = DEFAULT_JOB_PATH
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "{home}"
    umask: int = 0o077
    max_grace: float = 300.0
    mps_root: Path = Path("/var/lib/gpubudget/mps")
    mps_control: str = MPS_CONTROL
    mps_driver_probe: str = DRIVER_PROBE
    dynamic_mig: bool = False
    mig_root: Path = Path("/var/lib/gpubudget/mig")
    cgroup_root: str = ""
    contain: bool = True

    @property
    def gid(self) -> int | None:
        """The service group's id (records are readable by it), or None."""
        if not self.group:
            return None
        import grp

        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            raise LauncherError(f"config: group {self.group!r} does not exist") from None


def secure_path(p: Path, what: str, file: bool = False) -> None:
    """As root, refuse a path someone other than root could change: the file or directory
    and every directory above it must be owned by root and not writable by group or others
    (a world-writable directory with the sticky bit, like /tmp, is accepted)."""
    if os.geteuid() != 0:
        return
    p = Path(os.path.abspath(p))
    chain = [p, *p.parents]
    for i, q in enumerate(chain):
        try:
            st = os.lstat(q)
        except FileNotFoundError:
            if i == 0 and not file:
                continue  # the jobs root may not exist yet: it is made by root
            raise LauncherError(f"{what}: {q} does not exist") from None
        if stat.S_ISLNK(st.st_mode):
            raise LauncherError(f"{what}: {q} is a symbolic link")
        sticky = st.st_mode & stat.S_ISVTX and stat.S_ISDIR(st.st_mode)
        if st.st_uid != 0 or (st.st_mode & 0o022 and not (sticky and i > 0)):
            raise LauncherError(f"{what}: {q} can be changed by a user other than root "
                                f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")


def load_config(path: str) -> LauncherConfig:
    p = Path(path)
    if not p.is_absolute():
        raise LauncherError("--config: give an absolute path")
    secure_path(p, "config", file=True)
    try:
        raw = json.loads(p.read_bytes()[:65536])
    except (OSError, ValueError) as e:
        raise LauncherError(f"config {p}: {e}") from None
    if not isinstance(raw, dict):
        raise LauncherError(f"config {p}: expected a JSON object")
    unknown = set(raw) - KEYS
    if unknown:
        raise LauncherError(f"config {p}: unknown key {sorted(unknown)[0]!r}")
    root = raw.get("jobs_root")
    if not isinstance(root, str) or not os.path.isabs(root):
        raise LauncherError(f"config {p}: jobs_root must be an absolute path")
    return make_config(root, raw, str(p))


def make_config(jobs_root: str, raw: dict | None = None, where: str = "defaults") -> LauncherConfig:
    raw = raw or {}

    def bad(key: str, msg: str) -> LauncherError:
        return LauncherError(f"config {where}: {key}: {msg}")

    group = raw.get("group", "")
    if not isinstance(group, str):
        raise bad("group", "expected a group name")
    min_uid = raw.get("min_uid", 1000)
    if isinstance(min_uid, bool) or not isinstance(min_uid, int) or min_uid < 1:
        raise bad("min_uid", "expected a whole number >= 1 (root never runs jobs)")
    groups = raw.get("allowed_groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise bad("allowed_groups", "expected a list of group names")
    denied = raw.get("denied_users", ["nobody", "nfsnobody"])
    if not isinstance(denied, list) or not all(isinstance(u, str) for u in denied):
        raise bad("denied_users", "expected a list of user names")
    path = raw.get("path", DEFAULT_JOB_PATH)
    if not isinstance(path, str) or not all(os.path.isabs(d) for d in path.split(":")):
        raise bad("path", "expected absolute directories separated by ':'")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and ENV_KEY.fullmatch(k) and isinstance(v, str) and not bad_text(v)
            for k, v in env.items()):
        raise bad("env", "expected a mapping of variable names to strings")
    workdir = raw.get("workdir", "{home}")
    if not isinstance(workdir, str) or not (workdir.startswith("{home}")
                                            or os.path.isabs(workdir)):
        raise bad("workdir", "expected an absolute path template or one starting with {home}")
    umask = raw.get("umask", "0077")
    try:
        umask_v = int(umask, 8) if isinstance(umask, str) else -1
    except ValueError:
        umask_v = -1
    if not 0 <= umask_v <= 0o777:
        raise bad("umask", "expected an octal string such as '0077'")
    grace = raw.get("max_grace", 300)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 < grace <= 3600:
        raise bad("max_grace", "expected seconds, 0..3600")
    beside = os.path.dirname(os.path.abspath(jobs_root))
    mps: dict[str, str] = {}
    for key, default in (("mps_root", os.path.join(beside, "mps")),
                         ("mps_control", MPS_CONTROL), ("mps_driver_probe", DRIVER_PROBE),
                         ("mig_root", os.path.join(beside, "mig"))):
        v = raw.get(key, default)
        if not isinstance(v, str) or not os.path.isabs(v) or bad_text(v):
            raise bad(key, "expected an absolute path")
        mps[key] = os.path.normpath(v)
    dynamic_mig = raw.get("dynamic_mig", False)
    if not isinstance(dynamic_mig, bool):
        raise bad("dynamic_mig", "expected true or false")
    cgroup_root = raw.get("cgroup_root", "")
    if not isinstance(cgroup_root, str) or (cgroup_root and not os.path.isabs(cgroup_root)) \
            or bad_text(cgroup_root):
        raise bad("cgroup_root", "expected an absolute path, or \"\" for gpubudget under the "
                  "cgroup2 mount")
    contain = raw.get("contain", True)
    if not isinstance(contain, bool):
        raise bad("contain", "expected true or false")
    return LauncherConfig(Path(os.path.abspath(jobs_root)), group, min_uid, tuple(groups),
                          tuple(denied), path, dict(env), workdir, umask_v, float(grace),
                          Path(mps["mps_root"]), mps["mps_control"], mps["mps_driver_probe"],
                          dynamic_mig, Path(mps["mig_root"]),
                          os.path.normpath(cgroup_root) if cgroup_root else "", contain)
