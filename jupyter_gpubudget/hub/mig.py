"""MIG instances created for notebook sessions (``dynamic_mig``).

With ``GpuBudgetService.dynamic_mig`` (and ``BudgetSpawner.dynamic_mig``, which must match it)
the core may grant a session a MIG slice where no instance exists yet. Before the server
starts, the hub creates it — the GPU instance at the slice's placement and one compute
instance spanning it, with the launcher's own NVML steps (``launcher/mig.py``) — and the
server gets its ``MIG-<uuid>``. Every end of the server destroys it again (what was created
for that session only: recorded under ``BudgetSpawner.mig_state_dir`` as
``session-<id>.json``, so a restarted hub still destroys it). Creating instances needs root:
an unprivileged hub refuses such a start, saying so. MIG mode is never changed.

The NVML calls block, so they run in a thread, off the hub's event loop. ``NVML`` may be set
to a stand-in of the ``pynvml`` module (the tests do).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_gpubudget.backends import devices as dev
from jupyter_gpubudget.launcher.mig import Carved, MigError, create_instance

from .mps import holder

if TYPE_CHECKING:
    from .spawner import BudgetSpawner

#: the pynvml module the hub creates instances with (None: import it when needed)
NVML: Any = None


def _nvml() -> Any:
    if NVML is not None:
        return NVML
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        raise MigError("nvidia-ml-py (pynvml) is not installed in the hub's Python") from None
    return pynvml


def _carved(sp: BudgetSpawner) -> Carved:
    return Carved(Path(sp.mig_state_dir).absolute())


def _create(sp: BudgetSpawner, carves: list[dev.Carve], hold: str
            ) -> dict[tuple[str, int, str, int], str]:
    """Create every instance of ``carves`` for ``hold``, or none (in a thread: it blocks)."""
    carved, nv = _carved(sp), _nvml()
    created: dict[tuple[str, int, str, int], str] = {}
    try:
        for c in carves:
            try:
                rec = create_instance(nv, c.gpu_uuid, c.profile, c.start, c.size)
            except MigError as e:
                raise MigError(f"MIG {c.profile} at slot {c.start} of {c.gpu_uuid}: {e}") \
                    from None
            carved.save(hold, [*carved.load(hold), rec])
            created[c.key] = rec["uuid"]
    except BaseException:
        try:
            _destroy(sp, hold)
        except MigError as e:  # the creation's error matters more; this one is logged
            sp.log.error("gpubudget: %s: destroying what was created failed: %s", hold, e)
        raise
    return created


def _destroy(sp: BudgetSpawner, hold: str) -> list[str]:
    """Destroy what was created for ``hold``; what cannot be (still in use) stays recorded
    for the next end check, and is the error."""
    carved = _carved(sp)
    if not carved.load(hold):
        return []
    return carved.destroy(_nvml(), hold)


async def carve(sp: BudgetSpawner, placement: list[dict], discovery: Any
                ) -> dict[tuple[str, int, str, int], str]:
    """Create the MIG instances ``placement`` needs and does not have (dynamic_mig); returns
    (node, gpu, profile, start) -> ``MIG-<uuid>`` for ``placement_env``. Raises
    :class:`MigError` saying why, with nothing left created."""
    if discovery is None or not sp.dynamic_mig:
        return {}
    carves = dev.to_carve(placement, dev.device_map(discovery.inventory))
    if not carves:
        return {}
    if os.geteuid() != 0:
        raise MigError("this session's MIG slice has no instance yet, and creating one needs "
                       "root; this hub runs unprivileged (run it as root, or turn dynamic_mig "
                       "off so that sessions get the instances that exist)")
    created = await asyncio.to_thread(_create, sp, carves, holder(sp.session_id))
    sp.log.info("gpubudget: session %s: MIG instance(s) %s created for it", sp.session_id,
                ", ".join(created.values()))
    return created


async def release(sp: BudgetSpawner, session_id: str | None = None) -> None:
    """The session's server has ended: destroy the instances created for it. Idempotent;
    never raises (logged: an end must not fail over this)."""
    sid = sp.session_id if session_id is None else session_id
    if not sid or not sp.dynamic_mig:
        return
    try:
        done = await asyncio.to_thread(_destroy, sp, holder(sid))
    except Exception as e:  # noqa: BLE001 - logged; the server's end goes on
        sp.log.error("gpubudget: session %s: destroying its MIG instances failed: %s (tried "
                     "again at its next end check)", sid, e)
        return
    if done:
        sp.log.info("gpubudget: session %s ended: MIG instance(s) %s destroyed", sid,
                    ", ".join(done))
