"""Attacks on the privileged snapshot helper, as the demo exposes it: a
user's Unix account runs ``sudo -n <python> -I -m jupyter_gpubudget.snapshot.privileged VERB``
(the sudoers line of ``demo_setup.snapshot_sudoers_line``), with the real CRIU.

- a process's open file replaced by a symlink to root's file between dump and restore: the
  restore is refused with the reason, root's file is unchanged, no process is left;
- a tree holding a setuid child (``sleep | passwd``): never dumped, nothing left in /dev/shm;
- ``criu-finish`` without ``--kill`` resumes the kernel (it used to leave it stopped).
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from jupyter_gpubudget.snapshot.criu import find_criu
from jupyter_gpubudget.snapshot.privcall import Privileged
from tests.fixtures.unixusers import PREFIX, shared_tmp
from tests.hub.hubproc import require

from .conftest import require_root

USER = PREFIX + "mallory"
GROUP = "gbt-snapshotters"
PY = sys.executable


@pytest.fixture(scope="module")
def attacker():
    """A demo-like user account allowed the snapshot verbs through sudo, nothing else."""
    require_root()
    require(shutil.which("sudo") is not None, "sudo")
    require(find_criu() is not None, "CRIU >= 4.1 (make criu)")
    pw = demo_setup.ensure_user(USER)
    demo_setup.ensure_users_group([USER], GROUP)
    path = Path("/etc/sudoers.d/gbt-criu-attack")
    path.write_text(demo_setup.snapshot_sudoers_line(GROUP, PY) + "\n")
    os.chmod(path, 0o440)
    yield pw
    path.unlink(missing_ok=True)


def as_user(pw, *argv: str, **kw) -> subprocess.CompletedProcess:  # noqa: ANN001
    """Run a command as the attacker's account (its own uid, groups and environment)."""
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                           "--init-groups", "--reset-env", "--", *argv],
                          capture_output=True, text=True, timeout=300, **kw)


def verb(pw, *args: str) -> tuple[int, dict]:  # noqa: ANN001
    """One privileged verb through sudo, as the attacker would call it."""
    p = as_user(pw, "sudo", "-n", PY, "-I", "-m", "jupyter_gpubudget.snapshot.privileged",
                *args)
    try:
        return p.returncode, json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise AssertionError(f"no JSON answer (exit {p.returncode}): {p.stdout} {p.stderr}") \
            from None


def spawn_as(pw, shell: str) -> int:  # noqa: ANN001
    """A session leader of the attacker's running ``shell``; its pid."""
    p = subprocess.Popen(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                          "--init-groups", "--", "sh", "-c", shell], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    return p.pid


def shm_dumps() -> set[str]:
    """The attacker's dump directories (named for its uid by the helper), wherever they are
    (other suites may be dumping their own kernels meanwhile)."""
    uid = pwd.getpwnam(USER).pw_uid
    return {p for d in ("/dev/shm", "/tmp") for p in glob.glob(f"{d}/gpubudget-criu-{uid}-*")}


def gone(pid: int) -> None:
    for p in (pid,):
        try:
            os.killpg(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def test_a_symlinked_file_is_refused_at_restore_and_roots_file_is_unchanged(attacker):
    pw = attacker
    d = shared_tmp("gbt-criu-attack-")
    victim = d / "root-owned.conf"  # root's, 0644, the size of the attacker's file
    victim.write_text("root's own configuration line\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    own = d / "mine"
    own.mkdir()
    os.chown(own, pw.pw_uid, pw.pw_gid)
    mine = own / "notes.txt"
    mine.write_text("x" * len(before))
    os.chown(mine, pw.pw_uid, pw.pw_gid)
    os.chmod(mine, 0o644)
    pid = spawn_as(pw, f"exec 3<>{mine}; exec sleep 600")
    try:
        time.sleep(0.5)
        rc, out = verb(pw, "criu-dump", "--pid", str(pid))
        assert rc == 0, out
        images, seal = out["images_dir"], out["seal"]
        gone(pid)
        # the attack: the file it held read-write is now a symlink to root's file
        mine.unlink()
        os.symlink(victim, mine)
        os.lchown(mine, pw.pw_uid, pw.pw_gid)
        rc, out = verb(pw, "criu-restore", "--images-dir", images, "--seal", seal)
        assert rc == 2 and out["error"] == "unsafe", out
        assert "symbolic link" in out["message"] and str(mine) in out["message"], out
        assert victim.read_bytes() == before
        # replaced by root's file itself (no symlink): refused for the mode
        mine.unlink()
        shutil.copy2(victim, mine)
        rc, out = verb(pw, "criu-restore", "--images-dir", images, "--seal", seal)
        assert rc == 2 and out["error"] == "unsafe", out
        assert "may not read and write" in out["message"], out
        assert subprocess.run(["pgrep", "-u", str(pw.pw_uid), "-x", "sleep"]).returncode == 1
        # its own file back: the same images restore, as its own account
        mine.unlink()
        mine.write_text("x" * len(before))
        os.chown(mine, pw.pw_uid, pw.pw_gid)
        rc, out = verb(pw, "criu-restore", "--images-dir", images, "--seal", seal)
        assert rc == 0, out
        try:
            assert os.stat(f"/proc/{out['pid']}").st_uid == pw.pw_uid
            assert os.readlink(f"/proc/{out['pid']}/fd/3") == str(mine)
        finally:
            os.kill(out["pid"], signal.SIGKILL)
        shutil.rmtree(images, ignore_errors=True)
    finally:
        gone(pid)
    assert victim.read_bytes() == before


def test_a_race_past_the_name_check_is_caught_on_the_restored_process(attacker, tmp_path):
    """The name check runs before CRIU opens the file; the restored (still stopped) process
    is checked too, on what it really holds: a file it may not write is refused there."""
    from jupyter_gpubudget.snapshot import criu

    pw = attacker
    d = shared_tmp("gbt-criu-race-")
    victim = d / "root.conf"
    victim.write_text("0123456789\n")
    os.chmod(victim, 0o644)
    before = victim.read_bytes()
    pid = spawn_as(pw, f"exec 3<{victim}; exec sleep 600")  # read-only: allowed
    try:
        time.sleep(0.5)
        out = Privileged(command_prefix=["env", f"SUDO_UID={pw.pw_uid}"]).call(
            "criu-dump", pid=pid)
        gone(pid)
        restored = criu._restore(out["images_dir"], find_criu(), None, False, 120,
                                 only=pw.pw_uid, gids=criu.caller_gids(pw.pw_uid))
        try:  # what it may hold passes the live check
            assert os.readlink(f"/proc/{restored}/fd/3") == str(victim)
        finally:
            os.kill(restored, signal.SIGKILL)
        # the same process holding root's file for writing (as a race would leave it) fails it
        holder = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                  stdin=open(victim, "r+"), user=pw.pw_uid,
                                  group=pw.pw_gid)
        try:
            why = criu.live_problems(holder.pid, pw.pw_uid, criu.caller_gids(pw.pw_uid))
            assert any(str(victim) in w and "for writing" in w for w in why), why
        finally:
            holder.kill()
            holder.wait()
        shutil.rmtree(out["images_dir"], ignore_errors=True)
    finally:
        gone(pid)
    assert victim.read_bytes() == before


def test_a_tree_with_a_setuid_child_is_never_dumped(attacker):
    pw = attacker
    require(os.path.exists("/usr/bin/passwd") and os.stat("/usr/bin/passwd").st_mode & 0o4000,
            "a setuid /usr/bin/passwd")
    before = shm_dumps()
    pid = spawn_as(pw, "sleep 1000 | passwd")
    try:
        deadline = time.monotonic() + 10
        while not any(os.stat(f"/proc/{c}").st_uid == 0 or _euid(c) == 0
                      for c in _children(pid)):
            assert time.monotonic() < deadline, "passwd never started"
            time.sleep(0.1)
        for extra in ((), ("--keep-stopped",), ("--leave-running",)):
            rc, out = verb(pw, "criu-dump", "--pid", str(pid), *extra)
            assert rc == 2 and out["error"] == "unsafe", out
            assert "uids" in out["message"] and "passwd" in out["message"], out
            assert "images_dir" not in out and "seal" not in out
            assert shm_dumps() == before
            assert _state(pid) not in ("T", "t"), "the tree was left stopped"
    finally:
        gone(pid)


def test_images_with_another_accounts_task_are_destroyed_not_handed_out(attacker, tmp_path):
    """The images themselves are checked after the dump (the tree may change after the live
    check): a root dump of a tree holding a root task, checked for the user, is refused."""
    from jupyter_gpubudget.snapshot.criuimages import foreign_tasks, reg_files, task_creds

    pw = attacker
    pid = spawn_as(pw, "exec sleep 600")
    try:
        time.sleep(0.3)
        images = tmp_path / "img"
        out = Privileged(command_prefix=[]).call("criu-dump", pid=pid, images_dir=str(images),
                                                 leave_running=True)
        assert out["pid"] == pid
        creds = task_creds(str(images))
        assert [c.uids for c in creds] == [(pw.pw_uid,) * 4] and creds[0].comm == "sleep"
        gids = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
        assert foreign_tasks(str(images), pw.pw_uid, gids) == []
        assert "uids" in foreign_tasks(str(images), pw.pw_uid + 1, gids)[0]
        names = {r.name for r in reg_files(str(images))}
        assert any(n.endswith("/sleep") for n in names), names
    finally:
        gone(pid)


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def _euid(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    except OSError:
        pass
    return -1


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


def test_criu_finish_without_kill_resumes_the_kernel(attacker):
    pw = attacker
    argv = Privileged(command_prefix=["sudo", "-n"]).argv("criu-finish",
                                                          {"pid": 42, "kill": False})
    assert argv[-3:] == ["--pid", "42", "--resume"], argv
    pid = spawn_as(pw, "exec sleep 600")
    try:
        time.sleep(0.3)
        rc, out = verb(pw, "criu-dump", "--pid", str(pid), "--keep-stopped")
        assert rc == 0, out
        shutil.rmtree(out["images_dir"], ignore_errors=True)
        assert _state(pid) in ("T", "t")
        priv = Privileged(command_prefix=["setpriv", f"--reuid={pw.pw_uid}",
                                          f"--regid={pw.pw_gid}", "--init-groups",
                                          "--reset-env", "sudo", "-n"], python=PY)
        assert priv.call("criu-finish", pid=pid, kill=False) == {"pid": pid, "killed": False}
        assert _state(pid) in ("S", "R")
    finally:
        gone(pid)


def _sudo_as(pw) -> Privileged:  # noqa: ANN001
    return Privileged(command_prefix=["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
                                      "--init-groups", "--reset-env", "sudo", "-n"], python=PY)


@pytest.mark.parametrize("outcome", ["saved", "not stored", "refused"])
def test_a_user_snapshot_leaves_the_kernel_running_whatever_its_outcome(attacker, tmp_path,
                                                                       outcome):
    """A "snapshot now" (leave_running) as the user's server takes it under isolation: the
    kernel is stopped only for the dump and runs again after a stored snapshot, a snapshot the
    store refused, and a dump the helper refused; nothing is left in /dev/shm."""
    from jupyter_gpubudget.snapshot.base import KernelRef, SnapshotError
    from jupyter_gpubudget.snapshot.criusnap import CriuSnapshotter
    from jupyter_gpubudget.snapshot.store import Store

    pw = attacker
    before = shm_dumps()
    shell = "sleep 1000 | passwd" if outcome == "refused" else "exec sleep 600"
    pid = spawn_as(pw, shell)
    try:
        time.sleep(0.5)
        quota = {"p": 1000} if outcome == "not stored" else {}
        store = Store(str(tmp_path / "store"), project_quota=quota)
        cs = CriuSnapshotter(store, privileged=_sudo_as(pw), leave_running=True)
        ref = KernelRef(pid=pid, connection_file=str(tmp_path / "none.json"), session="s",
                        project="p", uid=pw.pw_uid)
        if outcome == "saved":
            snap = cs.dump(ref)
            assert [s.id for s in store.list()] == [snap.id]
        else:
            with pytest.raises(SnapshotError) as e:
                cs.dump(ref)
            assert ("quota" if outcome == "not stored" else "passwd") in e.value.message
            assert store.list() == []
        assert _state(pid) in ("S", "R"), f"the kernel was left {_state(pid)}"
        assert shm_dumps() == before
    finally:
        gone(pid)
