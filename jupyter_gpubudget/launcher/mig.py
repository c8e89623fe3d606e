"""MIG instances carved for work (``dynamic_mig``): the launcher's ``mig-create`` and
``mig-destroy`` verbs.

With ``GpuBudgetService.dynamic_mig`` the core may place a MIG slice where no instance exists
yet. Creating a GPU instance and its compute instance needs root, so the backend asks the
launcher: ``mig-create HOLDER GPU PROFILE START SIZE`` creates the GPU instance of that profile
at that placement (start slot, memory slots) on that GPU, with one compute instance spanning
it, and answers its ``MIG-<uuid>`` (what ``CUDA_VISIBLE_DEVICES`` names). When the holder's
work ends, ``mig-destroy HOLDER`` destroys what was created for it, and nothing else: each
creation is recorded under the config's ``mig_root`` (root's, 0700), so neither the service
nor a job can make the launcher destroy an instance the admin made.

Refused unless the launcher's config says ``"dynamic_mig": true`` (an admin opts in as root,
not only in the service's config). MIG mode itself is never changed here: the GPU must be in
MIG mode already (switching it needs an idle GPU and often a reset: an admin's step). NVML
refuses a placement that overlaps an existing instance, and the destruction of an instance a
process still uses; both come back as the verb's error.

NVML through ``pynvml`` (nvidia-ml-py, NVIDIA's own ctypes binding), imported only when a MIG
verb runs: the rest of the launcher stays standard library only. The functions take the
module as an argument so the tests can run them against a stand-in of it.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from .config import LauncherConfig, LauncherError, secure_path
from .mps import GPU_ID, HOLDER

#: a core profile name: '1g.18gb', '3g.71gb', '1g.35gb'
PROFILE = re.compile(r"^[1-8]g\.[0-9]{1,4}gb$")
#: GPU instance profile's compute slices -> the compute instance profile spanning it
CI_FOR_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
GI_PROFILE_COUNT = 0x12  # NVML_GPU_INSTANCE_PROFILE_COUNT
ENGINE_SHARED = 0x0  # NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED


class MigError(RuntimeError):
    """The instance could not be created or destroyed; the message says why."""


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _gi_profile(nv: Any, h: Any, profile: str) -> Any:
    """The GPU instance profile NVML names ``MIG <profile>`` on this GPU."""
    names = []
    for pid in range(GI_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
        except nv.NVMLError:  # not supported on this GPU
            continue
        name = _text(info.name).removeprefix("MIG ").strip()
        names.append(name)
        if name == profile:
            return info
    raise MigError(f"this GPU has no MIG profile {profile!r} (it has: "
                   f"{', '.join(names) or 'none'})")


def _mig_uuid(nv: Any, h: Any, gi_id: int, ci_id: int) -> str:
    for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except nv.NVMLError:  # an empty slot
            continue
        if (nv.nvmlDeviceGetGpuInstanceId(mh) == gi_id
                and nv.nvmlDeviceGetComputeInstanceId(mh) == ci_id):
            return _text(nv.nvmlDeviceGetUUID(mh))
    raise MigError(f"the new instance (GPU instance {gi_id}, compute instance {ci_id}) is not "
                   "listed among the GPU's MIG devices")


def create_instance(nv: Any, gpu: str, profile: str, start: int, size: int) -> dict[str, Any]:
    """Create ``profile`` at (``start``, ``size``) on ``gpu`` (its ``GPU-<uuid>``) with one
    compute instance spanning it; returns the record (gpu, gi, ci, uuid, profile, start).
    Nothing is left behind when a step fails."""
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise MigError(f"NVML is not usable here ({e}): no NVIDIA driver") from None
    try:
        try:
            h = nv.nvmlDeviceGetHandleByUUID(gpu)
        except nv.NVMLError as e:
            raise MigError(f"no GPU {gpu} on this machine ({e})") from None
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError:
            current = 0
        if not current:
            raise MigError(f"{gpu} is not in MIG mode; the launcher never changes it (an "
                           "admin enables it: nvidia-smi -i <gpu> -mig 1, on an idle GPU)")
        info = _gi_profile(nv, h, profile)
        placement = nv.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        try:
            gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(h, info.id, ctypes.byref(placement))
        except nv.NVMLError as e:
            raise MigError(f"creating {profile} at slot {start} on {gpu} failed ({e}); the "
                           "slots may be taken by another instance") from None
        try:
            gi_id = int(nv.nvmlGpuInstanceGetInfo(gi).id)
            ci_profile = CI_FOR_SLICES.get(int(info.sliceCount))
            if ci_profile is None:
                raise MigError(f"no compute instance profile spans {info.sliceCount} slices")
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile,
                                                                      ENGINE_SHARED)
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            try:
                ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
                uuid = _mig_uuid(nv, h, gi_id, ci_id)
            except BaseException:
                nv.nvmlComputeInstanceDestroy(ci)
                raise
        except BaseException as e:
            try:
                nv.nvmlGpuInstanceDestroy(gi)
            except nv.NVMLError:
                pass
            if isinstance(e, nv.NVMLError):
                raise MigError(f"creating the compute instance of {profile} on {gpu} failed "
                               f"({e})") from None
            raise
        return {"gpu": gpu, "gi": gi_id, "ci": ci_id, "uuid": uuid, "profile": profile,
                "start": start}
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


def destroy_instance(nv: Any, rec: dict[str, Any]) -> None:
    """Destroy the compute and GPU instance of a record made by :func:`create_instance`. An
    instance already gone is not an error."""
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        raise MigError(f"NVML is not usable here ({e}): no NVIDIA driver") from None
    try:
        h = nv.nvmlDeviceGetHandleByUUID(rec["gpu"])
        try:
            gi = nv.nvmlDeviceGetGpuInstanceById(h, int(rec["gi"]))
        except nv.NVMLError:
            return  # gone (a reset of the GPU, or an admin)
        try:
            ci = nv.nvmlGpuInstanceGetComputeInstanceById(gi, int(rec["ci"]))
            nv.nvmlComputeInstanceDestroy(ci)
        except nv.NVMLError as e:
            if "In use" in str(e) or "in use" in str(e):
                raise MigError(f"{rec['uuid']} is still in use ({e})") from None
        try:
            nv.nvmlGpuInstanceDestroy(gi)
        except nv.NVMLError as e:
            raise MigError(f"destroying {rec['uuid']} failed ({e})") from None
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


# ---------------------------------------------------------------------------- records
class Carved:
    """What was created for whom: ``<root>/<holder>.json``, a list of records (root's, 0600,
    in a 0700 directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _file(self, holder: str) -> Path:
        return self.root / f"{holder}.json"

    def load(self, holder: str) -> list[dict[str, Any]]:
        try:
            data = json.loads(self._file(holder).read_text())
        except FileNotFoundError:
            return []
        return data if isinstance(data, list) else []

    def save(self, holder: str, records: list[dict[str, Any]]) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.root.lstat()
        if self.root.is_symlink() or st.st_uid != os.geteuid():
            raise LauncherError(f"mig_root {self.root}: not a directory owned by the launcher")
        os.chmod(self.root, 0o700)
        f = self._file(holder)
        if not records:
            f.unlink(missing_ok=True)
            return
        tmp = self.root / f".{holder}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(records, out)
        os.replace(tmp, f)


    def destroy(self, nv: Any, holder: str) -> list[str]:
        """Destroy what was created for ``holder`` (its MIG uuids); what cannot be (still in
        use) stays recorded, so a later call tries again, and is the :class:`MigError`."""
        left, done, why = [], [], []
        for rec in self.load(holder):
            try:
                destroy_instance(nv, rec)
                done.append(rec["uuid"])
            except MigError as e:
                left.append(rec)
                why.append(str(e))
        self.save(holder, left)
        if why:
            raise MigError("; ".join(why))
        return done


def _import_nvml() -> Any:
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise LauncherError("mig: nvidia-ml-py (pynvml) is not installed in the launcher's "
                            "Python") from None
    return pynvml


def _checked(cfg: LauncherConfig, holder: str) -> Carved:
    if not cfg.dynamic_mig:
        raise LauncherError("mig: carving MIG instances is off in the launcher's config (an "
                            "admin sets \"dynamic_mig\": true there, with "
                            "GpuBudgetService.dynamic_mig)")
    if not HOLDER.fullmatch(holder):
        raise LauncherError(f"holder: {holder[:80]!r} is not a share's name")
    secure_path(cfg.mig_root, "mig_root")
    return Carved(cfg.mig_root)


def mig_create(cfg: LauncherConfig, args: list[str], stdin: BinaryIO,
               nvml: Any = None) -> dict[str, Any]:
    """``mig-create HOLDER GPU PROFILE START SIZE``: answers ``{"uuid": "MIG-…"}``."""
    if len(args) != 5:
        raise LauncherError("mig-create: expected HOLDER GPU PROFILE START SIZE")
    holder, gpu, profile, start_s, size_s = args
    carved = _checked(cfg, holder)
    if not GPU_ID.fullmatch(gpu):
        raise LauncherError(f"gpu: {gpu[:80]!r} is not a GPU's NVML id ('GPU-<uuid>')")
    if not PROFILE.fullmatch(profile):
        raise LauncherError(f"profile: {profile[:40]!r} is not a MIG profile such as 1g.18gb")
    if not (start_s.isdigit() and size_s.isdigit() and int(start_s) < 8
            and 1 <= int(size_s) <= 8 and int(start_s) + int(size_s) <= 8):
        raise LauncherError("mig-create: START and SIZE are memory slots, 0..7 and 1..8")
    nv = nvml or _import_nvml()
    try:
        rec = create_instance(nv, gpu, profile, int(start_s), int(size_s))
    except MigError as e:
        raise LauncherError(f"mig-create: {e}") from None
    carved.save(holder, [*carved.load(holder), rec])
    return {"uuid": rec["uuid"]}


def mig_destroy(cfg: LauncherConfig, args: list[str], stdin: BinaryIO,
                nvml: Any = None) -> dict[str, Any]:
    """``mig-destroy HOLDER``: destroy what was created for HOLDER. Answers
    ``{"destroyed": [uuid, ...]}``; what could not be destroyed stays recorded (a later call
    tries again) and is the error."""
    if len(args) != 1:
        raise LauncherError("mig-destroy: expected HOLDER")
    carved = _checked(cfg, args[0])
    if not carved.load(args[0]):
        return {"destroyed": []}
    try:
        done = carved.destroy(nvml or _import_nvml(), args[0])
    except MigError as e:
        raise LauncherError(f"mig-destroy: {e}") from None
    return {"destroyed": done}
