"""A requeued batch job restored straight from the snapshot store's chunks (real CRIU, the
real launcher, as root; the job runs as a test account).

The local backend no longer writes a checkpoint's images into a directory for the launcher:
it hands the launcher the store's chunk directory and the images' chunk lists, and the
launcher writes each image once, from its chunks into the private directory CRIU restores
from, checking each chunk. The store belongs to the account that calls the launcher (the
service, through sudo: ``SUDO_UID``); a chunk that is a symlink, or a file of anyone else,
is refused, so that account can never make root read a file it could not read itself. A
damaged chunk, another account's checkpoint, or a malformed list is refused too, and the job
starts again from its command, saying why.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_gpubudget.hub import demo_setup
from jupyter_gpubudget.snapshot.jobsnap import JobCheckpoints
from jupyter_gpubudget.snapshot.store import Store
from tests.fixtures.unixusers import PREFIX, ensure_accounts, shared_tmp

from .test_job_checkpoint import (  # noqa: F401 - the fixtures
    COUNTER,
    LAUNCHED,
    PY,
    _stop_jobs,
    counts,
    launcher,
    nodes,
    spec,
    wait_for,
)


def run(cfg: Path, verb: str, *args: str, spec: dict | None = None,  # noqa: F811
        sudo_uid: int | None = None) -> tuple[int, dict]:
    """The launcher as the service calls it through sudo (``SUDO_UID``: its account)."""
    if verb == "launch" and spec:
        LAUNCHED.append(lambda w=spec["workload"], n=spec["attempt"]: launcher(
            cfg, "signal", w, str(n), "1"))
    env = {"PATH": "/usr/bin:/bin"}
    if sudo_uid is not None:
        env["SUDO_UID"] = str(sudo_uid)
    r = subprocess.run([PY, "-I", "-m", "jupyter_gpubudget.launcher", "--config", str(cfg),
                        verb, *args], input=json.dumps(spec or {}).encode(),
                       capture_output=True, timeout=120, env=env)
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    for d, _dirs, files in os.walk(root):
        os.chown(d, uid, gid)
        for n in files:
            os.chown(os.path.join(d, n), uid, gid, follow_symlinks=False)


@pytest.fixture(scope="module")
def stored(nodes):  # noqa: F811
    """One checkpoint of a counting job in a snapshot store of the service's account, as
    the local backend leaves it after a preemption."""
    a, _ = nodes
    svc = pwd.getpwnam(demo_setup.SERVICE_USER)
    wid = f"cr{os.getpid():x}"
    rc, out = run(a["cfg"], "launch", spec=spec(wid, 1))
    assert rc == 0, out
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 5)
    rc, ck = run(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    base = shared_tmp("gpubudget-ckpt-store-")
    store = Store(str(base / "store"), keep_last=0)
    try:
        JobCheckpoints(store).save(wid, "lattice", ck["images_dir"],
                                   {"log": str(log1), "attempt": 1})
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
    rc, end = run(a["cfg"], "checkpoint-end", wid, "1", "kill")
    assert rc == 0 and end["exit"]["checkpointed"] is True, end
    got = JobCheckpoints(store).take(wid)
    assert got is not None
    _, where, info = got
    assert set(where) == {"chunks", "files"} and info["log"] == str(log1)
    _chown_tree(base, svc.pw_uid, svc.pw_gid)
    return {"wid": wid, "log1": log1, "last": counts(log1)[-1], "where": where,
            "svc": svc.pw_uid, "gid": svc.pw_gid}


def _copy(stored: dict) -> tuple[Path, dict]:
    """A copy of the checkpoint's chunk directory (the service's), to damage."""
    root = shared_tmp("gpubudget-ckpt-chunks-") / "chunks"
    shutil.copytree(stored["where"]["chunks"], root)
    _chown_tree(root, stored["svc"], stored["gid"])
    return root, {"chunks": str(root), "files": stored["where"]["files"]}


def _largest(where: dict) -> Path:
    ref = max((r for e in where["files"] for r in e["chunks"]), key=lambda r: r[1])
    return Path(where["chunks"]) / ref[0][:2] / f"{ref[0]}.{ref[2]}"


def _restore(node: dict, stored: dict, attempt: int, where: dict, user: str = PREFIX + "bob",
             sudo: bool = True) -> tuple[dict, Path]:
    rc, out = run(node["cfg"], "launch", spec={
        **spec(stored["wid"], attempt), "user": user,
        "restore": {**where, "log": str(stored["log1"])}},
        sudo_uid=stored["svc"] if sudo else None)
    assert rc == 0, out
    return out, node["jobs"] / stored["wid"] / str(attempt)


def _started_again(adir: Path, why: str) -> None:
    log = adir / "output.log"
    wait_for(lambda: len(counts(log)) > 2)
    assert counts(log)[0] == 0  # its command from its start
    assert "could not be restored" in log.read_text()
    text = (adir / "launcher.log").read_text()
    assert "not restored" in text and why in text, text[-1500:]


def test_a_job_resumes_from_the_stores_chunks(nodes, stored):  # noqa: F811
    _, b = nodes
    out, adir = _restore(b, stored, 2, stored["where"])
    wait_for(lambda: len(counts(adir / "output.log")) > 5)
    resumed = counts(adir / "output.log")
    assert resumed[0] == stored["last"] + 1, (stored["last"], resumed[:5])  # not from 0
    assert "restored from the snapshot store" in (adir / "launcher.log").read_text()
    assert os.stat(f"/proc/{out['pid']}").st_uid == pwd.getpwnam(PREFIX + "bob").pw_uid
    rc, sig = run(b["cfg"], "signal", stored["wid"], "2", "1")  # its pids are free again
    assert rc == 0 and sig["signalled"], sig


def test_a_chunk_that_is_a_symlink_to_roots_file_is_refused(nodes, stored):  # noqa: F811
    _, b = nodes
    secret = shared_tmp("gpubudget-root-only-") / "secret"
    secret.write_bytes(b"root's secret\n")
    secret.chmod(0o600)
    _, where = _copy(stored)
    chunk = _largest(where)
    chunk.unlink()
    os.symlink(secret, chunk)
    os.lchown(chunk, stored["svc"], stored["gid"])
    _, adir = _restore(b, stored, 3, where)
    _started_again(adir, "is a symlink")


def test_a_chunk_that_is_not_the_stores_accounts_is_refused(nodes, stored):  # noqa: F811
    _, b = nodes
    _, where = _copy(stored)
    os.chown(_largest(where), 0, 0)  # root's file now, the same bytes
    _, adir = _restore(b, stored, 4, where)
    _started_again(adir, f"is not a file of uid {stored['svc']}")


def test_a_damaged_chunk_is_found_and_the_job_starts_again(nodes, stored):  # noqa: F811
    _, b = nodes
    _, where = _copy(stored)
    chunk = _largest(where)
    with open(chunk, "r+b") as f:
        f.seek(os.path.getsize(chunk) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    _, adir = _restore(b, stored, 5, where)
    _started_again(adir, "images cannot be read back")  # its checksum, or zstd's


def test_another_accounts_checkpoint_is_not_restored_from_the_store(nodes, stored):  # noqa: F811
    _, b = nodes
    ensure_accounts(["carol"])
    _, adir = _restore(b, stored, 6, stored["where"], user=PREFIX + "carol")
    _started_again(adir, "not only")


@pytest.mark.parametrize("files, why", [
    ([{"name": "../../etc/x.img", "size": 1, "chunks": [["0" * 64, 1, "raw"]]}],
     "is not an image file"),
    ([{"name": "pages-1.img", "size": 2, "chunks": [["0" * 64, 1, "raw"]]}],
     "its chunks hold 1 bytes, not 2"),
    ([{"name": "pages-1.img", "size": 1, "chunks": [["../../etc/passwd", 1, "raw"]]}],
     "is not a chunk reference"),
    ("pages-1.img", "expected a list"),
])
def test_a_malformed_list_of_chunks_is_refused(nodes, files, why):  # noqa: F811
    a, _ = nodes
    rc, out = run(a["cfg"], "launch", spec={
        **spec(f"cm{os.getpid():x}", 1),
        "restore": {"chunks": "/var/tmp", "files": files, "log": "/var/tmp/x.log"}})
    assert rc == 2 and out["error"].startswith("restore.files") and why in out["error"], out



def test_a_damaged_raw_chunk_is_found_before_the_restored_job_runs(nodes):  # noqa: F811
    """Raw chunks (noise, stored uncompressed) are checked against their SHA-256 while CRIU
    restores from them: the restored tree stays stopped until they are, and is killed when
    one differs; the job starts again from its command and says why."""
    a, b = nodes
    svc = pwd.getpwnam(demo_setup.SERVICE_USER)
    wid = f"cw{os.getpid():x}"
    code = "import os\nnoise = os.urandom(40 << 20)\n" + COUNTER
    rc, out = run(a["cfg"], "launch", spec=spec(wid, 1, ["/usr/bin/python3", "-c", code]))
    assert rc == 0, out
    log1 = a["jobs"] / wid / "1" / "output.log"
    wait_for(lambda: len(counts(log1)) > 2)
    rc, ck = run(a["cfg"], "checkpoint", wid, "1")
    assert rc == 0 and ck["checkpointed"], ck
    base = shared_tmp("gpubudget-ckpt-raw-")
    store = Store(str(base / "store"), keep_last=0)
    try:
        JobCheckpoints(store).save(wid, "lattice", ck["images_dir"],
                                   {"log": str(log1), "attempt": 1})
    finally:
        subprocess.run(["rm", "-rf", ck["images_dir"]], check=False)
        run(a["cfg"], "checkpoint-end", wid, "1", "kill")
    got = JobCheckpoints(store).take(wid)
    assert got is not None
    where = got[1]
    _chown_tree(base, svc.pw_uid, svc.pw_gid)
    ref = max((r for e in where["files"] for r in e["chunks"]), key=lambda r: r[1])
    assert ref[2] == "raw" and ref[1] >= 1 << 20, ref  # the noise, stored as it is
    with open(Path(where["chunks"]) / ref[0][:2] / f"{ref[0]}.raw", "r+b") as f:
        f.seek(ref[1] // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    stored = {"wid": wid, "log1": log1, "svc": svc.pw_uid}
    _, adir = _restore(b, stored, 2, where)
    _started_again(adir, "does not match its checksum")
