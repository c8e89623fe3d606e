#!/usr/bin/env python3
"""A stand-in for ``nvidia-cuda-mps-control`` (no NVIDIA driver on the test machines), copied
onto PATH by the tests. Like the real program: ``-d`` starts a control daemon in the
background that listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` and logs to
``$CUDA_MPS_LOG_DIRECTORY/control.log`` (refused when one already answers there); without
arguments it is the front end: it sends each stdin line to the daemon, prints the answers and
exits 0, or exits 1 when no daemon answers. ``quit`` ends the daemon. Every invocation and
the daemon's own start are appended as JSON lines to ``calls.jsonl`` next to this file."""

import json
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def record(what: str, **extra: object) -> None:
    line = {"what": what, "argv": sys.argv[1:], "pid": os.getpid(), "uid": os.geteuid(),
            "env": {k: os.environ.get(k) for k in ENV_KEYS}, **extra}
    with open(HERE / "calls.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def talk(command: str) -> str | None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(pipe_dir() / "control"))
        s.sendall(command.encode() + b"\n")
        return s.makefile().readline().rstrip("\n")
    except OSError:
        return None
    finally:
        s.close()


def daemon() -> None:
    pipe = pipe_dir()
    logdir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    if talk("get_server_list") is not None:
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    pipe.mkdir(parents=True, exist_ok=True)
    sock_path = pipe / "control"
    sock_path.unlink(missing_ok=True)  # a dead daemon's socket
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    srv.listen(8)
    if os.fork():
        os._exit(0)  # the caller's -d returns once the daemon listens
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    record("daemon")
    with open(logdir / "control.log", "a") as log:
        log.write(f"daemon {os.getpid()} started for {os.environ.get('CUDA_VISIBLE_DEVICES')}\n")
        log.flush()
        while True:
            conn, _ = srv.accept()
            with conn:
                cmd = conn.makefile().readline().strip()
                log.write(f"command {cmd}\n")
                log.flush()
                if cmd == "quit":
                    conn.sendall(b"\n")
                    sock_path.unlink(missing_ok=True)
                    os._exit(0)
                conn.sendall(b"\n" if cmd == "get_server_list" else b"unknown command\n")


def main() -> None:
    record("call")
    if sys.argv[1:] == ["-d"]:
        daemon()
        return
    for line in sys.stdin:
        answer = talk(line.strip())
        if answer is None:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            sys.exit(1)
        print(answer)


if __name__ == "__main__":
    main()
