"""What the preemption outlook (core/outlook.py) costs beside a scheduling cycle, on the cycle
benchmark's cluster (bench/cycle.py: 1,024 nodes × 8 H100s, ~6,000 running, 10,000 queued):
the full cycle (``schedule``), then the outlook (the scheduler's own cycle at now, at each
protection end within the horizon — at most ``max_probes`` - 2 — and at the horizon's end),
on the bench's state and on its "tenth freed" state (in which the cycle places and preempts).
CPU-time medians (``time.process_time``: the machine may be shared); how many running
workloads the outlook foresees preempted. The service recomputes the outlook on the
forecast's cadence, not every cycle. Last line: one JSON object.

    python bench/preempt_outlook.py [--nodes 1024] [--queued 10000] [--repeat 3] [--seed 1]
                                    [--max-probes 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))

from bench.cycle import NOW, build_state, freed_tenth  # noqa: E402
from jupyter_gpubudget.core.outlook import preemption_outlook  # noqa: E402
from jupyter_gpubudget.core.scheduler import schedule  # noqa: E402


def cpu_median(fn, repeat: int) -> tuple[float, object]:  # noqa: ANN001
    times, out = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--queued", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-probes", type=int, default=6, help="as the service (Outlooks)")
    args = ap.parse_args()
    state = build_state(args.seed, args.nodes, args.queued)
    out: dict = {"nodes": args.nodes, "max_probes": args.max_probes, "running": len(state.running),
                 "queued": len(state.pending)}
    for name, st in (("full", state), ("freed", freed_tenth(state, args.seed))):
        cyc, _ = cpu_median(lambda st=st: schedule(st, NOW), args.repeat)
        look, res = cpu_median(lambda st=st: preemption_outlook(
            st, NOW, max_probes=args.max_probes), args.repeat)
        out[f"{name}_cycle_cpu_ms"] = round(cyc * 1000, 1)
        out[f"{name}_outlook_cpu_ms"] = round(look * 1000, 1)
        out[f"{name}_outlook_per_cycle"] = round(look / cyc, 2) if cyc else None
        out[f"{name}_foreseen"] = len(res)  # type: ignore[arg-type]
        print(f"{name}: cycle {cyc * 1000:.0f} ms CPU, outlook {look * 1000:.0f} ms CPU "
              f"({look / cyc:.1f} cycles), {len(res)} running workloads foreseen preempted",  # type: ignore[arg-type]
              flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
