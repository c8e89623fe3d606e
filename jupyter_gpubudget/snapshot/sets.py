"""A session's snapshot: one snapshot per kernel of the user's server, taken together.

What a user saves and restores is their *server*: every kernel it runs, each with the
notebooks and consoles it served. A **set** records that: for each kernel, its snapshot in the
store (CRIU or namespace, whichever could capture it) or why it has none, the kernel's name
(``python3``) and the sessions (notebook paths) it was attached to, so that a restore brings
each kernel back and attaches it to the same notebooks.

Layout, next to the store's own (``Store.root``)::

    sets/<session>/<set id>.json   a committed set (checksummed like a snapshot manifest)
    sets/<session>/<set id>.bad    a set that failed verification: the reason (kept, listed)

A set is written after every member snapshot was committed (each verified by the store), to a
temporary name, fsynced, loaded again and renamed: a crash leaves the previous sets usable.
Retention (``keep_last`` sets per session) and the per-project quota are applied to whole
sets; the store's own per-snapshot retention and quota are off for the members of sets.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field

from .base import SnapshotError
from .store import ID_RE, SESSION_RE, Store, _checksum, _fsync_dir

FORMAT = "gpubudget-set/1"


@dataclass(slots=True)
class Member:
    """One kernel of a set: its snapshot (``snapshot`` None when it could not be taken, with
    ``error``), and what it belonged to."""

    kernel_id: str
    kernel_name: str
    sessions: list[dict]  # {"path", "name", "type"} of the notebooks/consoles it served
    snapshot: str | None = None
    method: str | None = None
    error: str | None = None
    why_not: list[str] = field(default_factory=list)  # backends that could not take it, why
    raw_bytes: int = 0
    stored_bytes: int = 0
    seconds: float = 0.0
    variables: list[str] = field(default_factory=list)
    unsaved: dict[str, str] = field(default_factory=dict)


class Sets:
    """The sets of a store (see the module's docstring)."""

    def __init__(self, store: Store, keep_last: int = 3, quota: int = 0) -> None:
        self.store = store
        self.keep_last = keep_last
        self.quota = quota  # bytes this store's sets of one project may use (0: no limit)
        self.root = os.path.join(store.root, "sets")
        os.makedirs(self.root, exist_ok=True)

    # ------------------------------------------------------------ paths
    def new_id(self, session: str) -> str:
        if not SESSION_RE.fullmatch(session or ""):
            raise SnapshotError("bad_input", f"session: {session!r} is not a valid session id")
        return f"{session}--{time.time_ns() // 1_000_000:x}-{secrets.token_hex(3)}"

    def path(self, set_id: str) -> str:
        m = ID_RE.fullmatch(set_id or "")
        if not m:
            raise SnapshotError("not_found", f"not a snapshot id: {set_id!r}")
        return os.path.join(self.root, m.group(1), f"{set_id}.json")

    # ------------------------------------------------------------ writing
    def write(self, set_id: str, *, session: str, project: str, reason: str,
              members: list[Member], created_at: float, seconds: float,
              server: str = "") -> dict:
        """Publish a set whose members are committed snapshots (or failures)."""
        manifest = {
            "format": FORMAT, "id": set_id, "session": session, "project": project,
            "reason": reason, "server": server, "created_at": created_at,
            "seconds": seconds, "members": [asdict(m) for m in members],
        }
        manifest["checksum"] = _checksum(manifest)
        final = self.path(set_id)
        d = os.path.dirname(final)
        os.makedirs(d, exist_ok=True)
        tmp = f"{final}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(manifest, f)
            f.flush()
            if self.store.fsync:
                os.fsync(f.fileno())
        self._load(tmp)  # the test load: parses and matches its checksum
        os.replace(tmp, final)
        if self.store.fsync:
            _fsync_dir(d)
        return manifest

    # ------------------------------------------------------------ reading
    def _load(self, path: str) -> dict:
        try:
            with open(path) as f:
                m = json.load(f)
        except FileNotFoundError:
            raise SnapshotError("not_found", f"no snapshot {os.path.basename(path)[:-5]}") \
                from None
        except (OSError, ValueError) as e:
            raise SnapshotError("verify_failed", f"snapshot {os.path.basename(path)} does not "
                                f"load: {e}") from None
        if not isinstance(m, dict) or m.get("format") != FORMAT:
            raise SnapshotError("verify_failed", f"{os.path.basename(path)}: not a snapshot")
        if m.get("checksum") != _checksum(m):
            raise SnapshotError("verify_failed", f"snapshot {os.path.basename(path)[:-5]} does "
                                "not match its checksum")
        return m

    def load(self, set_id: str) -> dict:
        return self._load(self.path(set_id))

    def problem_of(self, set_id: str) -> str | None:
        try:
            with open(self.path(set_id)[:-5] + ".bad") as f:
                return f.read().strip() or "marked bad"
        except FileNotFoundError:
            return None

    def list(self, session: str | None = None) -> list[dict]:
        """Sets, newest first: each its manifest's summary plus ``status`` (``ok``,
        ``partial``: some kernels could not be saved, ``bad``: failed verification) and
        ``problem``."""
        sessions = [session] if session else sorted(os.listdir(self.root))
        out = []
        for s in sessions:
            d = os.path.join(self.root, s)
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                if not name.endswith(".json"):
                    continue
                sid = name[:-5]
                problem = self.problem_of(sid)
                try:
                    m = self._load(os.path.join(d, name))
                except SnapshotError as e:
                    out.append({"id": sid, "session": s, "status": "bad",
                                "problem": problem or e.message, "members": [],
                                "created_at": os.path.getmtime(os.path.join(d, name))})
                    continue
                out.append(self.summary(m, problem))
        out.sort(key=lambda x: (x["created_at"], x["id"]), reverse=True)
        return out

    @staticmethod
    def summary(m: dict, problem: str | None = None) -> dict:
        members = m["members"]
        failed = [x for x in members if not x.get("snapshot")]
        return {
            "id": m["id"], "session": m["session"], "project": m["project"],
            "reason": m["reason"], "server": m.get("server", ""),
            "created_at": m["created_at"], "seconds": m["seconds"],
            "methods": sorted({x["method"] for x in members if x.get("method")}),
            "kernels": len(members), "saved": len(members) - len(failed),
            "raw_bytes": sum(x.get("raw_bytes", 0) for x in members),
            "stored_bytes": sum(x.get("stored_bytes", 0) for x in members),
            "status": "bad" if problem else "partial" if failed else "ok",
            "problem": problem or "", "members": members,
        }

    # ------------------------------------------------------------ verification
    def verify(self, set_id: str, deep: bool = False) -> list[str]:
        """Problems of a set (empty: usable): its manifest loads and matches its checksum,
        every member snapshot it names is there and verifies."""
        try:
            m = self.load(set_id)
        except SnapshotError as e:
            return [e.message]
        problems = []
        for x in m["members"]:
            if x.get("snapshot"):
                problems += [f"kernel {x['kernel_name']} ({x['kernel_id'][:8]}): {p}"
                             for p in self.store.verify(x["snapshot"], deep=deep)]
        return problems

    def mark_bad(self, set_id: str, reason: str) -> None:
        path = self.path(set_id)[:-5] + ".bad"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(reason + "\n")
        try:
            for x in self.load(set_id)["members"]:
                if x.get("snapshot"):
                    self.store.mark_bad(x["snapshot"], f"member of bad snapshot {set_id}: "
                                        f"{reason}")
        except SnapshotError:
            pass

    def usable(self, session: str, deep: bool = False) -> tuple[dict | None, list[dict]]:
        """The newest set of a session that verifies now, and those skipped on the way
        (bad before, or failing now: marked bad here, with the reason)."""
        skipped = []
        for item in self.list(session):
            if item["status"] != "bad":
                problems = self.verify(item["id"], deep=deep)
                if not problems:
                    return self.load(item["id"]), skipped
                item["status"], item["problem"] = "bad", "; ".join(problems[:3])
                self.mark_bad(item["id"], item["problem"])
            skipped.append(item)
        return None, skipped

    # ------------------------------------------------------------ retention and space
    def delete(self, set_id: str, reason: str) -> None:
        """Delete a set and its member snapshots (their chunks go at the next gc)."""
        try:
            members = self.load(set_id)["members"]
        except SnapshotError:
            members = []
        for x in members:
            if x.get("snapshot"):
                try:
                    self.store.delete(x["snapshot"], reason)
                except SnapshotError:
                    pass
        path = self.path(set_id)
        for p in (path, path[:-5] + ".bad"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def apply_retention(self, session: str) -> list[str]:
        """Delete usable sets of a session beyond the newest ``keep_last``; returns ids."""
        good = [s for s in self.list(session) if s["status"] != "bad"]
        pruned = [s["id"] for s in good[max(self.keep_last, 1):]]
        for sid in pruned:
            self.delete(sid, f"retention: keep the last {self.keep_last}")
        return pruned

    def usage(self, project: str) -> int:
        refs: dict[str, list] = {}
        for s in self.list():
            if s.get("project") != project:
                continue
            for x in s["members"]:
                if x.get("snapshot"):
                    try:
                        refs.update({r[0]: r for r in self.store.load(x["snapshot"])["chunks"]})
                    except SnapshotError:
                        pass
        return self.store._stored_size(refs.values())

    def make_room(self, keep: str, project: str) -> list[str]:
        """Keep a project's sets within ``quota``: delete the oldest sets that are not the
        newest of their session; when that is not enough, delete ``keep`` itself and raise
        ``SnapshotError('quota')``. Returns the ids deleted."""
        if self.quota <= 0:
            return []
        deleted = []
        while (used := self.usage(project)) > self.quota:
            listed = [s for s in self.list() if s.get("project") == project]
            newest: dict[str, str] = {}
            for s in listed:
                newest.setdefault(s["session"], s["id"])
            victims = [s for s in reversed(listed)
                       if s["id"] != keep and newest.get(s["session"]) != s["id"]]
            if not victims:
                self.delete(keep, "quota")
                self.store.gc(min_age=0)
                raise SnapshotError("quota", f"project {project!r} would use {used} bytes of "
                                    f"snapshots, over its quota of {self.quota}; nothing older "
                                    "is left to delete")
            self.delete(victims[0]["id"], f"quota of project {project!r}")
            deleted.append(victims[0]["id"])
            self.store.gc(min_age=0)
        return deleted

    def remove_session(self, session: str) -> None:
        shutil.rmtree(os.path.join(self.root, session), ignore_errors=True)
