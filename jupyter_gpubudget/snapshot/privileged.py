"""Command line for the privileged launcher: ``python -m jupyter_gpubudget.snapshot.privileged``.

    criu-check
    criu-dump --pid PID [--images-dir DIR] [--leave-running | --keep-stopped]
              [--expect-uid UID] [--owner UID:GID]
    criu-finish --pid PID (--kill | --resume) [--expect-uid UID]
    criu-restore --images-dir DIR [--gpu] [--seal HEX]

Run through sudo (or any launcher that leaves the caller's uid in ``$SUDO_UID`` or the real
uid), the caller is unprivileged: see :mod:`.criu` for what that restricts (own processes only,
images in a directory chosen here, sealed dumps, restores only of sealed images) and how CRIU
then runs: as the caller's own account with ``CAP_CHECKPOINT_RESTORE`` only, never as root.

Each prints one JSON object on stdout: the result, or ``{"error": reason, "message", "log"}``
with exit status 2. Only :mod:`criu` (standard library) is imported: nothing of the service.
"""

from __future__ import annotations

import argparse
import json
import sys

from .criu import CriuError, criu_check, criu_dump, criu_finish, criu_restore


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    return int(uid), int(gid or uid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jupyter_gpubudget.snapshot.privileged")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("criu-check")
    d = sub.add_parser("criu-dump")
    d.add_argument("--pid", type=int, required=True)
    d.add_argument("--images-dir")
    d.add_argument("--leave-running", action="store_true")
    d.add_argument("--keep-stopped", action="store_true")
    d.add_argument("--expect-uid", type=int)
    d.add_argument("--owner", type=_owner)
    f = sub.add_parser("criu-finish")
    f.add_argument("--pid", type=int, required=True)
    g = f.add_mutually_exclusive_group(required=True)
    g.add_argument("--kill", action="store_true")
    g.add_argument("--resume", action="store_true")
    f.add_argument("--expect-uid", type=int)
    r = sub.add_parser("criu-restore")
    r.add_argument("--images-dir", required=True)
    r.add_argument("--gpu", action="store_true")
    r.add_argument("--seal")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "criu-check":
            out: dict = criu_check()
        elif a.cmd == "criu-dump":
            out = criu_dump(a.pid, a.images_dir, leave_running=a.leave_running,
                            keep_stopped=a.keep_stopped, expect_uid=a.expect_uid, owner=a.owner)
        elif a.cmd == "criu-finish":
            out = criu_finish(a.pid, kill=a.kill, expect_uid=a.expect_uid)
        else:
            out = {"pid": criu_restore(a.images_dir, gpu=a.gpu, seal_hex=a.seal)}
    except CriuError as e:
        print(json.dumps({"error": e.reason, "message": e.message, "log": e.log}))
        return 2
    except (OSError, ValueError) as e:  # reported as an error object, never a traceback
        print(json.dumps({"error": "failed", "message": f"{type(e).__name__}: {e}", "log": ""}))
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
