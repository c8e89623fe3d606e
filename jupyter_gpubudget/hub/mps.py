"""MPS control daemons for notebook sessions on MPS shares.

An MPS share's limits only hold when an MPS control daemon serves its GPU; without one the
server would run unconfined on the whole GPU. So before the server of a session granted an MPS
share on a real (NVML) GPU starts, the spawner holds that GPU's daemon (``launcher/mps.py``:
one per GPU, started for its first share, with its own pipe and log directories under
``BudgetSpawner.mps_state_dir``) as ``session-<session id>``, and the server gets the daemon's
``CUDA_MPS_PIPE_DIRECTORY``. Every end of the server lets go of it (the last share's end stops
the daemon); while the server runs, the watcher starts a daemon that died again. The holders
are files, so all of this survives a restart of the hub. Without the program or a driver the
start fails saying so: a share is confined or refused, never silently unconfined. A declared
inventory has no real GPUs: no daemon. The compute mode is never changed.

The calls block (the program runs, files are locked), so they run in a thread, off the hub's
event loop.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_gpubudget.backends import devices as dev
from jupyter_gpubudget.backends.mps import MpsDaemons, MpsUnavailable
from jupyter_gpubudget.launcher import config as launcher_config

if TYPE_CHECKING:
    from .spawner import BudgetSpawner

#: present while an NVIDIA kernel driver is loaded, as for the batch jobs' daemons (a file
#: stands in for it in the tests)
DRIVER_PROBE: str | Path = launcher_config.DRIVER_PROBE

_daemons: dict[tuple[str, str, str, bool], MpsDaemons] = {}
_checked: dict[tuple[str, str], float] = {}  # (root, gpu) -> when ensure last ran


def holder(session_id: str) -> str:
    """The holder a session's server is counted as (derived from the id kept in the hub's
    state, so a restarted hub lets go of what the old one held)."""
    return f"session-{session_id}"


def runs_as_others(sp: BudgetSpawner) -> bool:
    """Do servers run as other Unix users than the hub? A root hub's local process spawners
    run them as their users; SudoSpawner does so for an unprivileged hub. Other unprivileged
    spawners run them as the hub's own user."""
    return os.geteuid() == 0 or any(c.__name__ == "SudoSpawner"
                                    for c in sp.backend_spawner_class.__mro__)


def daemons(sp: BudgetSpawner) -> MpsDaemons:
    """The hub process's daemons for ``sp``'s settings (one object per settings: holders are
    files, so spawners sharing one is only a saving)."""
    other = runs_as_others(sp)
    key = (str(Path(sp.mps_state_dir).absolute()), sp.mps_control, str(DRIVER_PROBE), other)
    if key not in _daemons:
        _daemons[key] = MpsDaemons(key[0], sp.mps_control, driver_probe=DRIVER_PROBE,
                                   other_users=other, logger=sp.log)
    return _daemons[key]


def _why(d: MpsDaemons) -> str | None:
    """What stops a daemon here, in the hub's words where they differ from a batch job's."""
    why = d.missing()
    if why is not None and d.other_users and os.geteuid() != 0 and d.program() is not None \
            and d.driver_probe.exists():
        return ("MPS shares of notebook servers that run as other users (SudoSpawner) need "
                "the MPS control daemon to run as root, which starts each user's MPS server; "
                "this hub runs unprivileged. Give sessions whole GPUs or MIG slices, or run "
                "the hub as root")
    return why


def _hold(d: MpsDaemons, gpus: tuple[str, ...], hold: str) -> dict[str, str]:
    """``hold`` takes each GPU's daemon, or nothing (in a thread: it blocks)."""
    pipes: dict[str, str] = {}
    try:
        why = _why(d)
        if why is not None:
            raise MpsUnavailable(why)
        for gpu in gpus:
            try:
                pipes[gpu] = d.acquire(gpu, hold)
            except OSError as e:
                raise MpsUnavailable(f"the daemon's directories under {d.root}: {e} (set "
                                     "BudgetSpawner.mps_state_dir to a directory the hub may "
                                     "create)") from None
    except MpsUnavailable as e:
        d.release(hold)
        raise MpsUnavailable(f"MPS share on {', '.join(gpus)}: {e}") from None
    return pipes


async def acquire(sp: BudgetSpawner, placement: list[dict], discovery: Any,
                  migs: dict[tuple[str, int, str, int], str] | None = None
                  ) -> dict[str, str] | None:
    """Hold the daemon of each GPU carrying an MPS share of ``placement`` for ``sp``'s session
    (starting it for the first share); returns GPU id -> pipe directory for ``placement_env``
    (None: no share on a real GPU, no daemon). Raises :class:`MpsUnavailable` saying why when
    the daemon cannot run, holding nothing."""
    devices = dev.device_map(discovery.inventory if discovery is not None else None)
    if migs:  # instances just created for the session (mig.py)
        devices = dev.with_migs(devices, migs)
    built = dev.build(placement, devices)
    if not built.mps_gpus or built.declared:
        return None
    dev.build(placement, devices, dict.fromkeys(built.mps_gpus, "-"))  # one GPU per process
    sid = sp.session_id
    taking = asyncio.ensure_future(asyncio.to_thread(_hold, daemons(sp), built.mps_gpus,
                                                     holder(sid)))
    try:
        pipes = await asyncio.shield(taking)
    except asyncio.CancelledError:
        # the start was cancelled; the thread goes on: let go of what it took once done
        def let_go(f: asyncio.Future) -> None:
            if not f.cancelled():
                f.exception()  # retrieved: its failure does not matter any more
            asyncio.ensure_future(release(sp, sid))

        taking.add_done_callback(let_go)
        raise
    sp.log.info("gpubudget: session %s holds the MPS control daemon of %s", sid,
                ", ".join(pipes))
    return pipes


async def release(sp: BudgetSpawner, session_id: str | None = None) -> None:
    """The session's server has ended (``session_id``, default ``sp``'s): let go of the
    daemons it held; a GPU's last share stops its daemon. Idempotent; never raises (an end
    must not fail over this)."""
    sid = sp.session_id if session_id is None else session_id
    if not sid:
        return
    try:
        stopped = await asyncio.to_thread(daemons(sp).release, holder(sid))
    except Exception:  # noqa: BLE001 - logged; the server's end goes on
        sp.log.exception("gpubudget: releasing the MPS control daemons of session %s failed",
                         sid)
        return
    for gpu in stopped:
        sp.log.info("gpubudget: session %s was the last MPS share on %s: its daemon stopped",
                    sid, gpu)


async def supervise(sp: BudgetSpawner) -> None:
    """While the server runs: start again a daemon it holds that died. Each GPU is checked at
    most once per heartbeat_interval, however many sessions hold it. Logs what it cannot do."""
    if not sp.session_id:
        return
    d = daemons(sp)
    try:
        held = await asyncio.to_thread(d.held_by, holder(sp.session_id))
    except OSError as e:
        sp.log.error("gpubudget: MPS control daemons of session %s: %s", sp.session_id, e)
        return
    now = time.monotonic()
    for gpu in held:
        key = (str(d.root), gpu)
        if now - _checked.get(key, float("-inf")) < sp.heartbeat_interval:
            continue
        _checked[key] = now
        try:
            await asyncio.to_thread(d.ensure, gpu)
        except (MpsUnavailable, OSError) as e:
            sp.log.error("gpubudget: MPS control daemon for %s (session %s) is not running and "
                         "could not be started again: %s; tried again at the next heartbeat",
                         gpu, sp.session_id, e)
