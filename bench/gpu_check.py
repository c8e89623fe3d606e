"""Device check: run the project's NVML discovery against the real library on a GPU machine.

Prints the discovered inventory (GPUs, memory, MIG mode and instances with UUIDs, NVLink
domains), schedules one whole-GPU and one MIG request on it through the core, and reads every
GPU's health fields the service's NVML health source uses (XID events, retired pages pending,
row remapping, uncorrected ECC errors, temperature against the slowdown threshold, a GPU off
the bus). Ends with one JSON line. Without an NVIDIA driver it says so plainly and exits 0 —
nothing is faked here.

    python bench/gpu_check.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpubudget.core.accounts import load_budgets  # noqa: E402
from jupyter_gpubudget.core.mig import profiles_for  # noqa: E402
from jupyter_gpubudget.core.model import SliceRequest, Start, Workload  # noqa: E402
from jupyter_gpubudget.core.scheduler import Scheduler  # noqa: E402
from jupyter_gpubudget.inventory.health import NvmlHealthReader  # noqa: E402
from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, discover  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the discovery as JSON here")
    args = ap.parse_args()
    try:
        found = discover()
    except NoNvidiaDriver as e:
        print(f"SKIP: {e} — this check needs a machine with an NVIDIA GPU")
        return 0
    (node,) = found.inventory.nodes
    print(f"driver {found.driver}; node {node.name}; {len(node.gpus)} GPUs; NVLink {node.nvlink}")
    for g in node.gpus:
        print(f"  GPU{g.index}: {g.model} {g.memory_mib} MiB {g.uuid} MIG={'on' if g.mig else 'off'}")
    for m in found.mig_instances:
        print(f"    MIG {m.profile} @slot {m.start} on GPU{m.gpu}: {m.uuid}")
    accounts = load_budgets("accounts: {check: {grant: 100, members: [me]}}").accounts
    sched = Scheduler(accounts, found.inventory)
    reqs = [SliceRequest.whole(1)]
    mig_gpu = next((g for g in node.gpus if g.mig), None)
    if mig_gpu is not None:
        smallest = min(profiles_for(mig_gpu.model).values(), key=lambda p: p.size)
        reqs.append(SliceRequest.mig(smallest.name))
    for i, r in enumerate(reqs):
        ds = sched.submit(Workload(f"check{i}", "check", "me", r, 0.0), 0.0)
        print(f"  place {r.kind} {r.profile or r.gpus}: "
              + (str([(s.node, s.gpu, s.profile, s.mig_start) for s in ds[0].placement.slices])
                 if ds and isinstance(ds[0], Start) else "does not fit"))
    # the health source's fields (XID events are those since the reader registered for them)
    reader = NvmlHealthReader()
    reader.open()
    try:
        health = reader.read()
    finally:
        reader.close()
    print("health (what the NVML health source reads):")
    for h in health:
        print(f"  GPU{h.index}: temperature {h.temperature_c} °C (slowdown at {h.slowdown_c}); "
              f"retired pages pending {h.retired_pages_pending}; remapped rows "
              f"{h.remapped_rows}; uncorrected ECC {h.ecc_uncorrected}; XIDs {h.xids}; "
              f"lost {h.lost} -> " + ("; ".join(h.problems) or "healthy"))
    out = {"driver": found.driver, "node": node.name, "nvlink": node.nvlink,
           "gpus": [{"index": g.index, "model": g.model, "memory_mib": g.memory_mib,
                     "uuid": g.uuid, "mig": g.mig} for g in node.gpus],
           "mig_instances": [asdict(m) for m in found.mig_instances],
           "health": [h.as_dict() for h in health]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps({"gpus": len(node.gpus), "driver": found.driver,
                      "unhealthy": [h.index for h in health if h.problems],
                      "health_fields_read": sorted(k for k in health[0].as_dict()
                                                   if health[0].as_dict()[k] is not None)
                      if health else []}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
