"""The launcher's ``notify`` verb (a job's ``warn_signal`` ahead of a likely preemption), with
the real privileged launcher as root and the job running as a test account: it sends only
the signals a job may ask for, only to an attempt it started while that job still runs, and
stops nothing."""

from __future__ import annotations

import json
import os
import time

from tests.snapshot.test_job_checkpoint import launcher, nodes, spec, wait_for  # noqa: F401

TRAP = ("trap 'echo got-usr1' USR1; echo ready; "
        "while :; do sleep 0.1; done")


def test_notify_sends_the_asked_signal_and_stops_nothing(nodes):  # noqa: F811
    a, _ = nodes
    wid = f"nt{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec=spec(wid, 1, ["/bin/sh", "-c", TRAP]))
    assert rc == 0, out
    log = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: "ready" in log.read_text())
    rc, out = launcher(a["cfg"], "notify", wid, "1", "USR1")
    assert rc == 0 and out == {"notified": True, "signal": "USR1"}, out
    wait_for(lambda: "got-usr1" in log.read_text())
    assert "likely to be preempted soon: SIGUSR1 sent" in log.read_text()
    pid = int(json.loads((a["jobs"] / wid / "1" / "pid").read_text())["pid"])
    time.sleep(0.3)
    os.kill(pid, 0)  # still running: a warning, not a stop
    assert not (a["jobs"] / wid / "1" / "exit").exists()


def test_notify_refuses_other_signals_and_ended_or_unknown_attempts(nodes):  # noqa: F811
    a, _ = nodes
    wid = f"nu{os.getpid():x}"
    rc, out = launcher(a["cfg"], "launch", spec=spec(wid, 1, ["/bin/sh", "-c", TRAP]))
    assert rc == 0, out
    log = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: "ready" in log.read_text())
    for bad in ("KILL", "STOP", "SIGUSR1", "9", ""):
        rc, out = launcher(a["cfg"], "notify", wid, "1", bad)
        assert rc == 2 and "the signal is one of" in out["error"], (bad, out)
    for wid_bad, attempt in (("../etc", "1"), (wid, "x"), (wid, "0")):
        rc, out = launcher(a["cfg"], "notify", wid_bad, attempt, "USR1")
        assert rc == 2, out
    rc, out = launcher(a["cfg"], "notify", wid + "-none", "1", "USR1")
    assert out.get("notified") is not True, out
    assert "got-usr1" not in log.read_text()
    rc, out = launcher(a["cfg"], "signal", wid, "1", "1")
    assert rc == 0 and out["signalled"], out
    rc, out = launcher(a["cfg"], "notify", wid, "1", "USR1")
    assert rc == 0 and out == {"notified": False, "reason": "not running"}, out
