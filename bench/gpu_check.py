"""Device check: run the project's NVML discovery against the real library on a GPU machine.

Prints the discovered inventory (GPUs, memory, MIG mode and instances with UUIDs, NVLink
domains); schedules one whole-GPU request and, on a MIG GPU, one request for a profile of an
instance that exists (the fixed layout: read-only, no MIG setting or compute mode is changed)
through the core; turns each placement into ``CUDA_VISIBLE_DEVICES`` with the devices builder
(``backends/devices.py``) and checks every id through NVML (``nvmlDeviceGetHandleByUUID`` and
back); reads every GPU's health fields the service's NVML health source uses (XID events,
retired pages pending, row remapping, uncorrected ECC errors, temperature against the
slowdown threshold, a GPU off the bus). ``--mps`` also starts and stops an MPS control daemon
for one GPU in a temporary directory (launcher/mps.py; the compute mode is left as it is).
Ends with one JSON line. Without an NVIDIA driver it says so plainly and exits 2 — nothing is
faked here.

    python bench/gpu_check.py [--json OUT.json] [--mps]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpubudget.backends import devices as dev  # noqa: E402
from jupyter_gpubudget.backends.mps import MpsDaemons, MpsUnavailable  # noqa: E402
from jupyter_gpubudget.core.accounts import load_budgets  # noqa: E402
from jupyter_gpubudget.core.mig import profiles_for  # noqa: E402
from jupyter_gpubudget.core.model import SliceRequest, Start, Workload  # noqa: E402
from jupyter_gpubudget.core.scheduler import Scheduler  # noqa: E402
from jupyter_gpubudget.inventory.health import NvmlHealthReader  # noqa: E402
from jupyter_gpubudget.inventory.nvml import NoNvidiaDriver, _import_nvml, discover  # noqa: E402


def check_ids(ids: tuple[str, ...]) -> dict[str, str]:
    """Each CUDA device id -> 'ok' when NVML finds a device with exactly that UUID, else why
    not."""
    nv = _import_nvml()
    nv.nvmlInit()
    out = {}
    try:
        for i in ids:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(i)
                back = nv.nvmlDeviceGetUUID(h)
                back = back.decode() if isinstance(back, bytes) else str(back)
                out[i] = "ok" if back == i else f"NVML returned {back}"
            except nv.NVMLError as e:
                out[i] = f"NVML: {e}"
    finally:
        nv.nvmlShutdown()
    return out


def utilisation(node: str, whole: list[int], mig: list[tuple[int, int, str]],
                wait: float = 1.0, nvml: object = None) -> dict[str, dict]:
    """The busy sampler's readings (inventory/busy.py, as the service takes them): each
    whole GPU's device utilisation, each MIG instance's GPM sample pair (two ticks ``wait``
    apart: GPM needs two samples), with the memory each uses. None: NVML could not tell
    (e.g. a GPU without GPM), which the service records as unknown."""
    import time

    from jupyter_gpubudget.inventory.busy import BusySampler, Running

    runs = [Running(f"GPU{g}", [{"node": node, "gpu": g, "kind": "gpu", "milli": 1000}], 0.0)
            for g in whole]
    runs += [Running(f"GPU{g} MIG {p}@{st}", [{"node": node, "gpu": g, "kind": "mig",
                                                "profile": p, "mig_start": st, "milli": 1}],
                     0.0) for g, st, p in mig]
    sampler = BusySampler(nvml, node=node)
    t0 = time.time()
    sampler.tick(runs, t0)  # the first GPM samples
    time.sleep(wait)
    got = {w: (f, src) for w, _a, _b, f, src in sampler.tick(runs, time.time())}
    out = {}
    print("utilisation (what the busy sampler reads):" if runs else
          "utilisation: no GPU or MIG instance to read")
    for r in runs:
        f, src = got.get(r.workload, (None, None))
        mem = (sampler.memory_of(r.workload) or (None, None))[1]
        out[r.workload] = {"fraction": f, "source": src, "memory": mem}
        print(f"  {r.workload}: " + (f"{100 * f:.1f} % busy ({src})" if f is not None else
                                     "unknown (NVML could not tell: "
                                     f"{sampler.off or 'no reading for this slice'})") +
              (f"; memory {mem}" if mem else ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the discovery as JSON here")
    ap.add_argument("--mps", action="store_true", help="also start and stop an MPS control "
                    "daemon for one GPU (in a temporary directory)")
    args = ap.parse_args()
    try:
        found = discover()
    except NoNvidiaDriver as e:
        print(f"NO GPU: {e}. This check needs a machine with an NVIDIA GPU and its driver; "
              "nothing was checked.", file=sys.stderr)
        print(json.dumps({"gpus": 0, "error": str(e)}))
        return 2
    (node,) = found.inventory.nodes
    print(f"driver {found.driver}; node {node.name}; {len(node.gpus)} GPUs; NVLink {node.nvlink}")
    for g in node.gpus:
        print(f"  GPU{g.index}: {g.model} {g.memory_mib} MiB {g.uuid} MIG={'on' if g.mig else 'off'}")
    for m in found.mig_instances:
        print(f"    MIG {m.profile} @slot {m.start} on GPU{m.gpu}: {m.uuid}")
    accounts = load_budgets("accounts: {check: {grant: 100, members: [me]}}").accounts
    sched = Scheduler(accounts, found.inventory)
    reqs = [SliceRequest.whole(1)]
    # a MIG GPU's instances are its fixed layout: ask for a profile that exists there
    mig_gpu = next((g for g in node.gpus if g.mig and g.mig_layout), None)
    if mig_gpu is not None:
        smallest = min({p for p, _ in mig_gpu.mig_layout or ()},
                       key=lambda p: profiles_for(mig_gpu.model)[p].size)
        reqs.append(SliceRequest.mig(smallest))
    elif any(g.mig for g in node.gpus):
        print("  MIG mode is on but no MIG instance exists: no MIG placement to check "
              "(instances are the admin's to create; this check changes nothing)")
    devices = dev.device_map(found.inventory)
    placed: list[dict] = []
    id_checks: dict[str, str] = {}
    for i, r in enumerate(reqs):
        ds = sched.submit(Workload(f"check{i}", "check", "me", r, 0.0), 0.0)
        if not ds or not isinstance(ds[0], Start):
            print(f"  place {r.kind} {r.profile or r.gpus}: does not fit")
            continue
        placement = [asdict(s) for s in ds[0].placement.slices]
        built = dev.build(placement, devices)
        checks = check_ids(built.ids)
        id_checks.update(checks)
        placed.append({"request": r.profile or f"{r.gpus} GPU", "placement": placement,
                       "CUDA_VISIBLE_DEVICES": built.env["CUDA_VISIBLE_DEVICES"]})
        print(f"  place {r.kind} {r.profile or r.gpus}: "
              f"{[(s['node'], s['gpu'], s['profile'], s['mig_start']) for s in placement]} -> "
              f"CUDA_VISIBLE_DEVICES={built.env['CUDA_VISIBLE_DEVICES']} "
              f"(NVML: {', '.join(f'{k} {v}' for k, v in checks.items())})")
    mps: dict = {}
    if args.mps:
        gpu = next((g for g in node.gpus if not g.mig), None)
        if gpu is None:
            mps = {"error": "every GPU is in MIG mode; MPS check skipped"}
        else:
            with tempfile.TemporaryDirectory(prefix="gpubudget-mps-") as root:
                m = MpsDaemons(root)
                try:
                    pipe = m.acquire(gpu.uuid, "gpu-check")
                    mps = {"gpu": gpu.uuid, "started": m.alive(gpu.uuid), "pipe": pipe}
                    mps["stopped"] = m.release("gpu-check") == [gpu.uuid] \
                        and not m.alive(gpu.uuid)
                except MpsUnavailable as e:
                    mps = {"error": str(e)}
        print(f"  MPS control daemon: {mps}")
    busy = utilisation(node.name, [g.index for g in node.gpus if not g.mig],
                       [(m.gpu, m.start, m.profile) for m in found.mig_instances])
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
           "placements": placed, "device_ids": id_checks, "mps": mps,
           "health": [h.as_dict() for h in health], "utilisation": busy}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    ids_ok = bool(id_checks) and all(v == "ok" for v in id_checks.values())
    print(json.dumps({"gpus": len(node.gpus), "driver": found.driver,
                      "placements": len(placed), "mig_placed": any(
                          s["kind"] == "mig" for p in placed for s in p["placement"]),
                      "device_ids_ok": ids_ok, "mps": mps,
                      "unhealthy": [h.index for h in health if h.problems],
                      "utilisation": {k: v["fraction"] for k, v in busy.items()},
                      "health_fields_read": sorted(k for k in health[0].as_dict()
                                                   if health[0].as_dict()[k] is not None)
                      if health else []}))
    return 0 if ids_ok and (not args.mps or mps.get("stopped")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
