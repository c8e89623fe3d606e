"""`gpubudget budgets check` on the hostile budgets files of the security review: wall time and
peak memory (maximum resident set) of the whole command, for each file, against the review's
bounds (2 s, 200 MB). Also a legitimate file of 20,000 projects for scale. Last line: one JSON
object.

    python bench/budgets_check.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.security.hostile_budgets import write_all  # noqa: E402

LIMIT_S, LIMIT_MB = 2.0, 200.0


def run(path: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_gpubudget.cli", "budgets", "check",
                             str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="gpubudget-bench-"))
    files = {name: p for name, (p, _) in write_all(d).items()}
    legit = d / "legit-20000.yaml"
    legit.write_text("accounts:\n" + "".join(
        f"  p{i}: {{grant: 1, members: [u{i}]}}\n" for i in range(20_000)))
    files["legit-20000-projects"] = legit
    baseline = d / "tiny.yaml"
    baseline.write_text("accounts:\n  a: {grant: 1}\n")
    files["tiny (start-up cost)"] = baseline
    out = {}
    print(f"{'file':28} {'seconds':>8} {'peak MB':>8} {'exit':>5}  (limits {LIMIT_S:g} s, "
          f"{LIMIT_MB:g} MB)")
    for name, p in files.items():
        secs, mb, code = run(p)
        out[name] = {"s": round(secs, 3), "peak_mb": round(mb, 1), "exit": code}
        print(f"{name:28} {secs:8.2f} {mb:8.1f} {code:5d}")
    hostile = {k: v for k, v in out.items() if not k.startswith(("legit", "tiny"))}
    worst_s = max(v["s"] for v in hostile.values())
    worst_mb = max(v["peak_mb"] for v in hostile.values())
    print(f"worst hostile file: {worst_s:.2f} s ({worst_s / LIMIT_S:.0%} of the limit), "
          f"{worst_mb:.0f} MB ({worst_mb / LIMIT_MB:.0%} of the limit)")
    shutil.rmtree(d, ignore_errors=True)
    print(json.dumps({"bench": "budgets_check", "worst_s": worst_s, "worst_peak_mb": worst_mb,
                      "within_limits": worst_s <= LIMIT_S and worst_mb <= LIMIT_MB,
                      "files": out}))


if __name__ == "__main__":
    main()
