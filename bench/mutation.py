"""Mutation score of the scheduling core: how many small, realistic bugs in
``jupyter_gpubudget/core/`` — a flipped comparison, a dropped condition, ``max`` for ``min``,
a value replaced by None, an argument left out — the core's own tests (``tests/core``) catch.

    .venv/bin/python bench/mutation.py            # run mutmut (what is not decided yet), report
    .venv/bin/python bench/mutation.py --reuse    # report the last run's results only
    .venv/bin/python bench/mutation.py --fresh    # throw every result away, run everything
    .venv/bin/python bench/mutation.py --survivors [module ...]   # list what got through

mutmut 3 is configured in pyproject.toml (``[tool.mutmut]``): it writes every mutant of the
core into ``mutants/``, records once which core tests reach which function, then runs each
mutant against those tests only (stopping at the first failure), two at a time. A mutant is

- killed: a test failed; timeout: the tests ran far longer than on the clean code (an endless
  loop) — counted as caught, as mutmut's own score does;
- survived: every test passed; no tests: no core test even calls the function — both count
  as missed;
- equivalent: listed in ``tests/core/equivalent_mutants.txt`` with a one-line reason why no
  test can tell it from the original; left out of the rate and counted on their own. A
  listed mutant that a test kills is counted as killed (and reported: the listing is wrong).

mutmut keeps a mutant's verdict until its function changes, not when the tests change. So
results are kept only while ``tests/core`` is what it was when they were produced (a hash of
its files is stored next to them); otherwise this script starts over (``--fresh``).

kill rate = (killed + timeout) / (mutants − equivalent), per module and overall. Prints a table,
the run's wall time, then one JSON line:
``{"kill_rate", "min_module_kill_rate", "mutants", "killed", "timeout", "survived",
"no_tests", "equivalent", "seconds"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
CORE = "jupyter_gpubudget/core"
EQUIVALENT = ROOT / "tests" / "core" / "equivalent_mutants.txt"
FINGERPRINT = MUTANTS / "bench-tests.sha256"

#: mutmut's exit codes → the bench's categories (mutmut/stats.py: status_by_exit_code)
KILLED = {1, 3}
TIMEOUT = {36, -24, 24, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


def tests_fingerprint() -> str:
    """A hash of what decides the verdicts besides the core itself: the core tests and the
    mutmut configuration."""
    h = hashlib.sha256()
    for p in sorted((ROOT / "tests" / "core").glob("*")):
        if p.is_file() and p.suffix in (".py", ".txt"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update((ROOT / "pyproject.toml").read_bytes())
    return h.hexdigest()


def mutmut_bin() -> str:
    exe = Path(sys.executable).parent / "mutmut"
    if exe.exists():
        return str(exe)
    found = shutil.which("mutmut")
    if not found:
        sys.exit("mutmut is not installed: `make mutation` (or pip install -e '.[mutation]')")
    return found


def run_mutmut(names: list[str], max_children: int) -> float:
    """Run ``mutmut run`` (all undecided mutants, or the given names/patterns) in the
    repository; return its wall time in seconds."""
    cmd = [mutmut_bin(), "run", "--max-children", str(max_children), *names]
    print("$", " ".join(cmd[1:]), flush=True)
    t = time.monotonic()
    env = dict(os.environ, PYTHONHASHSEED="0")
    MUTANTS.mkdir(exist_ok=True)
    log_path = MUTANTS / "run.log"
    with open(log_path, "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        sys.exit(f"mutmut run failed (exit {rc}); the end of {log_path}:\n{tail}")
    return time.monotonic() - t


def load_results() -> dict[str, int | None]:
    """mutant name → mutmut exit code (None: not tested yet), for every core module."""
    out: dict[str, int | None] = {}
    for meta in sorted((MUTANTS / CORE).glob("*.py.meta")):
        data = json.loads(meta.read_text())
        out.update(data.get("exit_code_by_key", {}))
    return out


def load_equivalent() -> dict[str, str]:
    """Listed equivalent mutants: ``name  reason`` per line (# comments, blank lines)."""
    out: dict[str, str] = {}
    if not EQUIVALENT.exists():
        return out
    for n, line in enumerate(EQUIVALENT.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            sys.exit(f"{EQUIVALENT}:{n}: {name}: give a one-line reason why it is equivalent")
        out[name] = reason.strip()
    return out


def module_of(name: str) -> str:
    # jupyter_gpubudget.core.<module>.x_<function>__mutmut_<n>
    return name.split(".")[2]


def category(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code in TIMEOUT:
        return "timeout"
    if code in SURVIVED:
        return "survived"
    if code in NO_TESTS:
        return "no_tests"
    if code is None:
        return "not_checked"
    return "other"


def report(results: dict[str, int | None], equivalent: dict[str, str], seconds: float | None
           ) -> dict[str, object]:
    per: dict[str, Counter[str]] = {}
    wrong: list[str] = []
    for name, code in results.items():
        c = per.setdefault(module_of(name), Counter())
        cat = category(code)
        if name in equivalent:
            if cat in ("killed", "timeout"):
                wrong.append(name)  # a test tells it apart: not equivalent
            else:
                cat = "equivalent"
        c[cat] += 1
        c["mutants"] += 1
    stale = sorted(set(equivalent) - set(results))
    cols = ["mutants", "killed", "timeout", "survived", "no_tests", "equivalent", "other",
            "not_checked"]
    print(f"{'module':<15}" + "".join(f"{c:>12}" for c in cols) + f"{'kill rate':>11}")
    total: Counter[str] = Counter()
    rates: dict[str, float] = {}
    for mod in sorted(per):
        c = per[mod]
        total.update(c)
        rates[mod] = rate(c)
        print(f"{mod:<15}" + "".join(f"{c[k]:>12}" for k in cols) + f"{rates[mod]:>10.1%}")
    overall = rate(total)
    print(f"{'all':<15}" + "".join(f"{total[k]:>12}" for k in cols) + f"{overall:>10.1%}")
    if wrong:
        print(f"\n{len(wrong)} mutants listed as equivalent are killed by a test (counted "
              "as killed; take them off the list):")
        for name in wrong:
            print("   ", name)
    if stale:
        print(f"\n{len(stale)} mutants listed as equivalent no longer exist (their function "
              "changed; review the list):")
        for name in stale:
            print("   ", name)
    if total["not_checked"] or total["other"]:
        print(f"\nnot decided: {total['not_checked']} not checked, {total['other']} "
              "suspicious or crashed (counted as missed)")
    worst = min(rates.items(), key=lambda kv: kv[1]) if rates else ("", 0.0)
    print(f"\nlowest module: {worst[0]} {worst[1]:.1%}; overall {overall:.1%} of "
          f"{total['mutants'] - total['equivalent']} mutants "
          f"({total['equivalent']} equivalent left out)")
    if seconds is not None:
        print(f"mutmut run: {seconds:.0f} s wall ({seconds / 60:.1f} min)")
    return {"kill_rate": round(overall, 4), "min_module_kill_rate": round(worst[1], 4),
            "mutants": total["mutants"], "killed": total["killed"],
            "timeout": total["timeout"], "survived": total["survived"],
            "no_tests": total["no_tests"], "equivalent": total["equivalent"],
            "seconds": round(seconds) if seconds is not None else None}


def rate(c: Counter[str]) -> float:
    counted = c["mutants"] - c["equivalent"]
    return (c["killed"] + c["timeout"]) / counted if counted else 1.0


def survivors(results: dict[str, int | None], equivalent: dict[str, str],
              modules: list[str]) -> None:
    for name, code in sorted(results.items()):
        if modules and module_of(name) not in modules:
            continue
        cat = category(code)
        if cat in ("survived", "no_tests", "other", "not_checked") and name not in equivalent:
            print(f"{cat:<10} {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reuse", action="store_true", help="report the last results, run nothing")
    ap.add_argument("--fresh", action="store_true", help="drop all results and run everything")
    ap.add_argument("--survivors", nargs="*", metavar="MODULE",
                    help="list the mutants that got through (of these core modules)")
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    os.chdir(ROOT)
    equivalent = load_equivalent()
    if args.survivors is not None:
        survivors(load_results(), equivalent, args.survivors)
        return
    seconds = None
    if not args.reuse:
        fp = tests_fingerprint()
        if MUTANTS.exists() and (args.fresh or not FINGERPRINT.exists()
                                 or FINGERPRINT.read_text().strip() != fp):
            why = "--fresh" if args.fresh else "tests/core or the configuration changed"
            print(f"dropping the previous results ({why})")
            shutil.rmtree(MUTANTS)
        seconds = run_mutmut([], args.max_children)
        FINGERPRINT.write_text(fp + "\n")
    elif not MUTANTS.exists():
        sys.exit("no results yet: run without --reuse")
    else:
        fp = tests_fingerprint()
        if not FINGERPRINT.exists() or FINGERPRINT.read_text().strip() != fp:
            print("note: tests/core changed since these results were produced")
    results = load_results()
    if not results:
        sys.exit("no mutants found under mutants/")
    print(json.dumps(report(results, equivalent, seconds)))


if __name__ == "__main__":
    main()
