"""Seconds each suite (tests/<dir>) took in `make test`'s lanes, read from their JUnit XML:
what to look at when one lane ends long after the other (move a suite to LANE_A or out)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(paths: list[str]) -> None:
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"{path}: no times ({e})")
            continue
        per: dict[str, float] = defaultdict(float)
        for case in root.iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            suite = "/".join(parts[:2]) if parts[0] == "tests" else parts[0]
            per[suite] += float(case.get("time") or 0)
        row = ", ".join(f"{s} {t:.0f}" for s, t in sorted(per.items(), key=lambda x: -x[1]))
        print(f"{path}: {sum(per.values()):.0f} s: {row}")


if __name__ == "__main__":
    main(sys.argv[1:])
