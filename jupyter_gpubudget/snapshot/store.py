"""The snapshot store: content-addressed chunks plus one manifest per snapshot.

Layout under ``root``::

    chunks/<hh>/<sha256>.zst|.raw      every chunk, once (see chunkio)
    snapshots/<session>/<id>.json      a committed, verified snapshot's manifest
    snapshots/<session>/<id>.bad       a snapshot that failed verification: the reason (kept)
    staging/<id>/                      a snapshot being taken (removed on commit or abort)

A snapshot becomes visible only when its manifest is renamed into ``snapshots/``, after every
chunk it references has been written, fsynced, read back and checked, and the manifest itself
has been written, fsynced and loaded again with its checksum: a crash at any point leaves the
previous snapshots as they were. A snapshot that fails verification (then or later, before a
restore) is marked bad with the reason, never used and never deleted without saying so.
Retention keeps the last ``keep_last`` good snapshots per session; a per-project quota bounds
the bytes a project's snapshots occupy (chunks shared between snapshots counted once).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from traitlets import Bool, Dict, Enum, Int, Unicode
from traitlets.config import LoggingConfigurable

from . import chunkio
from .base import Snapshot, SnapshotError

FORMAT = "gpubudget-snapshot/1"
SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
ID_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,47})--[0-9a-f]{11,13}-[0-9a-f]{6}$")


def _checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(slots=True)
class Staging:
    """A snapshot being taken: write chunks into ``chunk_root``, anything else into ``dir``."""

    id: str
    session: str
    project: str
    method: str
    dir: str
    chunk_root: str
    started: float = field(default_factory=time.time)


@dataclass(slots=True)
class Listed:
    """A snapshot as listed: ``status`` is ``ok`` or ``bad`` (with ``problem``)."""

    id: str
    session: str
    project: str
    method: str
    created_at: float
    raw_bytes: int
    stored_bytes: int
    status: str
    problem: str = ""


class Store(LoggingConfigurable):
    root = Unicode(help="Directory of the snapshot store (chunks, manifests, staging).").tag(
        config=True)
    keep_last = Int(3, help="Good snapshots kept per session (older ones are deleted after a "
                    "new one is committed; snapshots that failed verification are kept and "
                    "not counted). 0: none deleted here (snapshot sets keep their own).").tag(
        config=True)
    project_quota = Dict(value_trait=Int(), per_key_traits=None, help="Bytes a project's "
                         "snapshots may occupy, by project name (chunks shared between "
                         "snapshots are counted once).").tag(config=True)
    default_quota = Int(0, help="Quota in bytes for projects not in project_quota "
                        "(0: no quota).").tag(config=True)
    fsync = Bool(True, help="fsync chunks and manifests before a snapshot counts as taken "
                 "(turn off only for throwaway stores).").tag(config=True)
    compress = Enum(["auto", "always", "never"], "auto", help="Compress chunks with zstd: "
                    "'auto' when it saves more disk time than it costs CPU time (measured "
                    "while writing: a slow disk gets compressed chunks, a fast one raw ones); "
                    "'always' whenever it saves space; 'never'. Noise is never compressed."
                    ).tag(config=True)
    verify_on_commit = Enum(["written", "full"], "written", help="How a new snapshot is "
                            "verified before it counts as taken. 'written': the chunks it "
                            "wrote itself were hashed from the data, written and fdatasynced, "
                            "so they are checked for presence and size; the chunks it reuses "
                            "from earlier snapshots are read back and checked in full. 'full': "
                            "every chunk is read back and checked.").tag(config=True)
    gc_min_age = Int(3600, help="Seconds an unreferenced chunk is kept before garbage "
                     "collection removes it (longer than any snapshot takes: a snapshot being "
                     "taken may reuse it).").tag(config=True)

    def __init__(self, root: str | None = None, **kw) -> None:  # noqa: ANN003
        if root is not None:
            kw["root"] = root
        super().__init__(**kw)
        if not self.root:
            raise ValueError("Store.root must be set")
        self.root = os.path.abspath(self.root)
        for d in ("chunks", "snapshots", "staging"):
            os.makedirs(os.path.join(self.root, d), exist_ok=True)

    # ------------------------------------------------------------ paths and locking
    @property
    def chunk_root(self) -> str:
        return os.path.join(self.root, "chunks")

    def _session_dir(self, session: str) -> str:
        return os.path.join(self.root, "snapshots", session)

    def manifest_path(self, snapshot_id: str) -> str:
        m = ID_RE.fullmatch(snapshot_id)
        if not m:
            raise SnapshotError("not_found", f"not a snapshot id: {snapshot_id!r}")
        return os.path.join(self._session_dir(m.group(1)), f"{snapshot_id}.json")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(os.path.join(self.root, "lock"), "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @property
    def compress_arg(self) -> bool | str:
        """``compress`` as ChunkWriter takes it."""
        return {"auto": "auto", "always": True, "never": False}[self.compress]

    def quota_of(self, project: str) -> int:
        return int(self.project_quota.get(project, self.default_quota))

    # ------------------------------------------------------------ taking a snapshot
    def begin(self, session: str, project: str, method: str) -> Staging:
        if not SESSION_RE.fullmatch(session or ""):
            raise SnapshotError("bad_input", f"session: {session!r} is not a valid session id "
                                "(letters, digits, . _ -; at most 48)")
        if method not in ("criu", "namespace"):
            raise SnapshotError("bad_input", f"method: unknown snapshot method {method!r}")
        sid = f"{session}--{time.time_ns() // 1_000_000:x}-{secrets.token_hex(3)}"
        d = os.path.join(self.root, "staging", sid)
        os.makedirs(d, mode=0o700)
        return Staging(sid, session, project, method, d, self.chunk_root)

    def abort(self, staging: Staging) -> None:
        """Drop a snapshot being taken (its new chunks are collected by :meth:`gc`)."""
        shutil.rmtree(staging.dir, ignore_errors=True)

    def commit(self, staging: Staging, payload: dict, refs: list[list], *, raw_bytes: int,
               written_bytes: int, seconds: dict | None = None,
               summary: dict | None = None, fresh: dict[str, int] | None = None) -> Snapshot:
        """Verify and publish a snapshot: its chunks checked (see ``verify_on_commit``;
        ``fresh``: digest -> stored size of the chunks this snapshot wrote and synced), the
        manifest written, fsynced, loaded again and renamed into place. Then retention and
        quota. On any failure nothing is published and :class:`SnapshotError` says why."""
        seconds = dict(seconds or {})
        t0 = time.perf_counter()
        unique = {r[0]: r for r in refs}
        fresh = fresh if self.verify_on_commit == "written" and fresh else {}
        problems = []
        for d, size in fresh.items():
            if d not in unique:
                continue
            try:
                st = os.stat(chunkio.chunk_path(self.chunk_root, d, unique[d][2]))
                if st.st_size != size:
                    problems.append(f"chunk {d[:12]} has {st.st_size} bytes stored, "
                                    f"{size} were written")
            except FileNotFoundError:
                problems.append(f"chunk {d[:12]} is missing")
        problems += chunkio.verify_refs(self.chunk_root, [r for d, r in unique.items()
                                                          if d not in fresh], deep=True)
        if problems:
            self.abort(staging)
            raise SnapshotError("verify_failed", f"snapshot {staging.id} failed verification: "
                                + "; ".join(problems[:5]))
        stored = self._stored_size(unique.values())
        manifest = {
            "format": FORMAT, "id": staging.id, "session": staging.session,
            "project": staging.project, "method": staging.method,
            "created_at": staging.started, "payload": payload, "chunks": list(unique.values()),
            "raw_bytes": int(raw_bytes), "stored_bytes": stored,
            "written_bytes": int(written_bytes), "seconds": seconds, "summary": summary or {},
        }
        manifest["checksum"] = _checksum(manifest)
        with self._locked():
            self._make_room(staging, stored, unique)
            sdir = self._session_dir(staging.session)
            os.makedirs(sdir, exist_ok=True)
            final = os.path.join(sdir, f"{staging.id}.json")
            tmp = os.path.join(staging.dir, "manifest.json")
            with open(tmp, "w") as f:
                json.dump(manifest, f)
                f.flush()
                if self.fsync:
                    os.fsync(f.fileno())
            self._load(tmp)  # the test load: parses and matches its checksum
            os.replace(tmp, final)
            if self.fsync:
                _fsync_dir(sdir)
            seconds["verify"] = time.perf_counter() - t0
            pruned = self.apply_retention(staging.session, _locked=True)
        shutil.rmtree(staging.dir, ignore_errors=True)
        snap = self._snapshot(manifest, final)
        snap.seconds = seconds
        snap.summary = dict(summary or {}, pruned=pruned)
        return snap

    def _stored_size(self, refs) -> int:  # noqa: ANN001
        total = 0
        for r in refs:
            try:
                total += os.stat(chunkio.chunk_path(self.chunk_root, r[0], r[2])).st_size
            except FileNotFoundError:
                pass
        return total

    def _make_room(self, staging: Staging, stored: int, unique: dict) -> None:
        quota = self.quota_of(staging.project)
        if quota <= 0:
            return
        while True:
            listed = [s for s in self.list(project=staging.project)]
            refs: dict[str, list] = dict(unique)
            for s in listed:
                refs.update({r[0]: r for r in self._refs_of(s.id)})
            used = self._stored_size(refs.values())
            if used <= quota:
                return
            newest = {}
            for s in listed:  # newest first: the first seen per session is its latest
                newest.setdefault(s.session, s.id)
            victims = [s for s in reversed(listed)
                       if s.status == "ok" and newest.get(s.session) != s.id]
            if not victims:
                self.abort(staging)
                raise SnapshotError(
                    "quota", f"project {staging.project!r} would use {used} bytes of snapshots, "
                    f"over its quota of {quota}; nothing older is left to delete")
            self.delete(victims[0].id, f"quota of project {staging.project!r}", _locked=True)

    # ------------------------------------------------------------ reading
    def _load(self, path: str) -> dict:
        try:
            with open(path) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise SnapshotError("not_found", f"no manifest at {path}") from None
        except (OSError, ValueError) as e:
            raise SnapshotError("verify_failed", f"manifest {os.path.basename(path)} does not "
                                f"load: {e}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise SnapshotError("verify_failed", f"manifest {os.path.basename(path)}: "
                                "not a snapshot manifest")
        if manifest.get("checksum") != _checksum(manifest):
            raise SnapshotError("verify_failed", f"manifest {os.path.basename(path)} does not "
                                "match its checksum")
        return manifest

    def load(self, snapshot_id: str) -> dict:
        """The manifest of a snapshot, checked (raises SnapshotError)."""
        return self._load(self.manifest_path(snapshot_id))

    def _refs_of(self, snapshot_id: str) -> list:
        try:
            return self.load(snapshot_id)["chunks"]
        except SnapshotError:
            return []

    def _snapshot(self, manifest: dict, path: str) -> Snapshot:
        return Snapshot(
            id=manifest["id"], session=manifest["session"], project=manifest["project"],
            method=manifest["method"], created_at=manifest["created_at"], manifest=path,
            digest=manifest["checksum"], raw_bytes=manifest["raw_bytes"],
            stored_bytes=manifest["stored_bytes"], written_bytes=manifest["written_bytes"],
            seconds=manifest.get("seconds", {}), summary=manifest.get("summary", {}))

    def get(self, snapshot_id: str) -> Snapshot:
        return self._snapshot(self.load(snapshot_id), self.manifest_path(snapshot_id))

    def list(self, session: str | None = None, project: str | None = None) -> list[Listed]:
        """Snapshots, newest first, good and bad (a manifest that no longer loads is listed
        bad with the reason, so it is seen rather than ignored)."""
        base = os.path.join(self.root, "snapshots")
        sessions = [session] if session else sorted(os.listdir(base))
        out: list[Listed] = []
        for s in sessions:
            d = os.path.join(base, s)
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                if not name.endswith(".json"):
                    continue
                sid = name[:-5]
                bad = os.path.join(d, f"{sid}.bad")
                problem = ""
                if os.path.exists(bad):
                    with open(bad) as f:
                        problem = f.read().strip() or "marked bad"
                try:
                    m = self._load(os.path.join(d, name))
                    item = Listed(sid, m["session"], m["project"], m["method"], m["created_at"],
                                  m["raw_bytes"], m["stored_bytes"], "bad" if problem else "ok",
                                  problem)
                except SnapshotError as e:
                    item = Listed(sid, s, "", "", os.path.getmtime(os.path.join(d, name)), 0, 0,
                                  "bad", problem or e.message)
                if project is None or item.project == project:
                    out.append(item)
        out.sort(key=lambda x: (x.created_at, x.id), reverse=True)
        return out

    # ------------------------------------------------------------ verification
    def verify(self, snapshot_id: str, deep: bool = True) -> list[str]:
        """Problems of a snapshot (empty when it is usable): its manifest loads and matches
        its checksum, every chunk is there and (``deep``) matches its checksum."""
        try:
            m = self.load(snapshot_id)
        except SnapshotError as e:
            return [e.message]
        return chunkio.verify_refs(self.chunk_root, m["chunks"], deep=deep)

    def mark_bad(self, snapshot_id: str, reason: str) -> None:
        """Record that a snapshot must not be used (kept for inspection, listed as bad)."""
        path = self.manifest_path(snapshot_id)[:-5] + ".bad"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(reason + "\n")
        self.log.warning("snapshot %s marked bad: %s", snapshot_id, reason)

    def usable(self, session: str, deep: bool = True) -> tuple[Snapshot | None, list[Listed]]:
        """The newest snapshot of a session that verifies now, and the ones skipped on the way
        (already bad, or failing now: those are marked bad here, with the reason)."""
        skipped: list[Listed] = []
        for item in self.list(session=session):
            if item.status == "ok":
                problems = self.verify(item.id, deep=deep)
                if not problems:
                    return self.get(item.id), skipped
                item.status, item.problem = "bad", "; ".join(problems[:5])
                self.mark_bad(item.id, item.problem)
            skipped.append(item)
        return None, skipped

    # ------------------------------------------------------------ retention and space
    def delete(self, snapshot_id: str, reason: str, _locked: bool = False) -> None:
        """Delete a snapshot's manifest (and bad marker); its chunks go at the next gc."""
        def go() -> None:
            path = self.manifest_path(snapshot_id)
            for p in (path, path[:-5] + ".bad"):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            self.log.info("snapshot %s deleted: %s", snapshot_id, reason)

        if _locked:
            go()
        else:
            with self._locked():
                go()

    def apply_retention(self, session: str, _locked: bool = False) -> list[str]:
        """Delete good snapshots of a session beyond the newest ``keep_last``; returns ids."""
        if self.keep_last <= 0:  # kept by whoever groups them (snapshot sets)
            return []
        good = [s for s in self.list(session=session) if s.status == "ok"]
        pruned = [s.id for s in good[self.keep_last:]]
        for sid in pruned:
            self.delete(sid, f"retention: keep the last {self.keep_last}", _locked=_locked)
        return pruned

    def usage(self, project: str) -> int:
        refs: dict[str, list] = {}
        for s in self.list(project=project):
            refs.update({r[0]: r for r in self._refs_of(s.id)})
        return self._stored_size(refs.values())

    def gc(self, min_age: float | None = None) -> int:
        """Remove chunks no manifest references, older than ``min_age`` seconds (a snapshot
        being taken refreshes the chunks it reuses). Returns how many were removed."""
        min_age = self.gc_min_age if min_age is None else min_age
        with self._locked():
            live: set[str] = set()
            base = os.path.join(self.root, "snapshots")
            for s in os.listdir(base):
                for name in os.listdir(os.path.join(base, s)):
                    if name.endswith(".json"):
                        try:
                            live.update(r[0] for r in self._load(
                                os.path.join(base, s, name))["chunks"])
                        except SnapshotError:
                            # a manifest that does not load: keep everything it may reference
                            return 0
            removed, now = 0, time.time()
            for d in os.listdir(self.chunk_root):
                for name in os.listdir(os.path.join(self.chunk_root, d)):
                    path = os.path.join(self.chunk_root, d, name)
                    digest = name.split(".", 1)[0]
                    if digest in live:
                        continue
                    try:
                        if now - os.path.getmtime(path) >= min_age:
                            os.unlink(path)
                            removed += 1
                    except FileNotFoundError:
                        pass
            return removed
