"""Wrapper the local backend starts: records its pid, runs the command, records the exit.

``python -m jupyter_gpubudget.backends.local_run DIR -- command ...``

Writes ``DIR/pid`` (``<pid> <starttime>``) before starting the command and ``DIR/exit``
(JSON: exit_code, ended_at) atomically after it ends, so a restarted service knows how an
attempt ended even if it was not the wrapper's parent any more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def proc_starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None  # a zombie has ended
    return fields[19]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: local_run DIR -- command ...", file=sys.stderr)
        return 2
    d = Path(argv[0])
    cmd = argv[2:]
    write_atomic(d / "pid", f"{os.getpid()} {proc_starttime(os.getpid())}\n")
    with open(d / "output.log", "ab") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 cwd=os.environ.get("GPUBUDGET_WORKDIR") or d)

        def forward(signum: int, _frame: object) -> None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = child.wait()
    write_atomic(d / "exit", json.dumps({"exit_code": code, "ended_at": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
