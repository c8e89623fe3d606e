"""``MappedLocalProcessSpawner``: JupyterHub's LocalProcessSpawner (the server runs as a Unix
account, with that account's HOME and SHELL) where the account is given by a template or a map
instead of being the hub user's name, and is never root or a system account.

The same mapping as the batch jobs' (``LocalBackend.unix_user_template`` / ``unix_users``):
configure both alike, e.g. ``c.MappedLocalProcessSpawner.unix_user_template = "demo-{username}"``.

Containment, as for batch jobs (``jupyter_gpubudget/launcher/cgroups.py``): the hub (root)
makes a cgroup for each server and the server joins it before it execs; the server has ended
only once that cgroup is empty. A process a notebook started in a new session (``setsid``,
a daemon) is killed with the server instead of keeping the GPU the session held; ``poll``
says "running" while any process is left. No cgroup, no server (unless ``contain`` is off).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import shutil
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Bool, Dict, Float, Integer, Unicode

from jupyter_gpubudget.launcher import cgroups


class MappedLocalProcessSpawner(LocalProcessSpawner):
    unix_user_template = Unicode(
        "{username}", config=True,
        help="The Unix account a hub user's server runs as; {username} is the hub user name.")
    unix_users = Dict({}, config=True, help="Hub user name -> Unix account (overrides the "
                                            "template for those users).")
    home_dir_template = Unicode(
        "", config=True,
        help="The server's HOME and working directory: {unix_user} is the Unix account, "
             "{username} the hub user; it must exist and belong to the account. Empty: the "
             "account's home (/etc/passwd).")
    min_uid = Integer(1000, config=True, help="Servers never run as an account with a smaller "
                                              "uid (root, system accounts).")

    @property
    def unix_name(self) -> str:
        name = self.user.name
        return self.unix_users.get(name) or self.unix_user_template.format(username=name)

    def account(self) -> pwd.struct_passwd:
        try:
            pw = pwd.getpwnam(self.unix_name)
        except KeyError:
            raise web.HTTPError(403, f"{self.user.name} has no Unix account "
                                     f"{self.unix_name!r} on this machine") from None
        if pw.pw_uid == 0 or pw.pw_uid < self.min_uid or pw.pw_uid == 65534:
            raise web.HTTPError(403, f"{self.user.name} maps to {self.unix_name!r} (uid "
                                     f"{pw.pw_uid}): servers never run as root or a system "
                                     "account (nor nobody)")
        return pw

    cgroup_root = Unicode("", config=True, help="The cgroup v2 directory under which each "
                          "server gets its own cgroup (session.<uid>.<random>); empty: "
                          "'gpubudget' under the cgroup2 mount found in /proc/self/mountinfo. "
                          "The hub must be root to make them.")
    contain = Bool(True, config=True, help="Run each server in its own cgroup and count it "
                   "ended only when that cgroup is empty. False is UNSAFE: processes a "
                   "notebook starts in a new session (setsid, daemons) outlive the session "
                   "on a GPU given to someone else.")
    contain_wait = Float(10.0, config=True, help="Seconds a poll or stop waits for a killed "
                         "server's cgroup to empty before saying the server still runs (it is "
                         "killed again at the next poll).")
    cgroup = Unicode("")  # this server's cgroup (kept in the spawner's state)

    async def start(self) -> Any:
        if self.contain:
            if self.cgroup and cgroups.populated(self.cgroup):
                raise web.HTTPError(409, f"the previous server of {self.user.name} still has "
                                         "processes; try again when they have ended")
            try:
                root = cgroups.find_root(self.cgroup_root)
                cg = cgroups.prepare(root, cgroups.session_name(self.account().pw_uid,
                                                                secrets.token_hex(8)))
            except cgroups.ContainmentError as e:
                raise web.HTTPError(500, f"containment: the server was not started: {e} "
                                         "(MappedLocalProcessSpawner.cgroup_root / contain)"
                                    ) from None
            self.cgroup = str(cg)
        try:
            return await super().start()
        except BaseException:
            if self.cgroup:
                await self._end_cgroup()
            raise

    def make_preexec_fn(self, name: str) -> Any:
        self.account()
        set_user = super().make_preexec_fn(self.unix_name)
        cg = self.cgroup if self.contain else ""
        home = self.home(self.account()) if self.home_dir_template else ""

        def preexec() -> None:
            if cg:  # as root, before anything of the user's runs
                cgroups.join(cg)
            set_user()
            if home:  # as the user: the server starts (and serves files) in its home
                os.chdir(home)

        return preexec

    async def _end_cgroup(self) -> bool:
        """Kill what is left in the server's cgroup and wait (``contain_wait``) until it is
        empty; True once it is (then it is removed and forgotten)."""
        cg = self.cgroup
        if not cg:
            return True
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, cgroups.end, cg, self.contain_wait):
            self.log.warning("server of %s: processes are left in %s after SIGKILL; it "
                             "counts as running", self.user.name, cg)
            return False
        self.cgroup = ""
        return True

    async def poll(self) -> int | None:
        """Running while the server's process or anything in its cgroup is: once the server
        has exited, whatever it left behind is killed before it counts as ended."""
        status = await super().poll()
        if status is None or await self._end_cgroup():
            return status
        return None

    async def stop(self, now: bool = False) -> None:
        await super().stop(now=now)
        if self.cgroup:
            while not await self._end_cgroup():  # the session's end waits for its last one
                await asyncio.sleep(1.0)

    def get_state(self) -> dict:
        state = super().get_state()
        if self.cgroup:
            state["cgroup"] = self.cgroup
        return state

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        cg = state.get("cgroup")
        if isinstance(cg, str) and os.path.isabs(cg) and os.path.basename(cg).startswith(
                "session."):
            self.cgroup = cg

    def home(self, pw: pwd.struct_passwd) -> str:
        """The server's home: the template's, else the account's."""
        if not self.home_dir_template:
            return pw.pw_dir
        home = self.home_dir_template.format(unix_user=pw.pw_name, username=self.user.name)
        try:
            st = os.lstat(home)
        except OSError:
            raise web.HTTPError(500, f"{home} (the server's home) does not exist") from None
        if not os.path.isdir(home) or os.path.islink(home) or st.st_uid != pw.pw_uid:
            raise web.HTTPError(500, f"{home} (the server's home) is not a folder of "
                                     f"{pw.pw_name}'s own")
        return home

    def user_env(self, env: dict) -> dict:
        pw = self.account()
        env["USER"] = pw.pw_name
        home = self.home(pw)
        if home:
            env["HOME"] = home
        if pw.pw_shell:
            env["SHELL"] = pw.pw_shell
        return env

    async def move_certs(self, paths: dict) -> dict:
        """internal_ssl: the server's certificates go to the mapped account's home."""
        pw = self.account()
        hub_dir = os.path.join(pw.pw_dir, ".jupyterhub")
        out_dir = os.path.join(hub_dir, "jupyterhub-certs")
        for d in (hub_dir, out_dir):  # root writes in the user's home: never through a link
            if os.path.islink(d):
                raise web.HTTPError(500, f"{d} is a symbolic link; not writing certificates")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir, 0o700, exist_ok=True)
        out = {}
        for key in ("keyfile", "certfile", "cafile"):
            dst = os.path.join(out_dir, os.path.basename(paths[key]))
            (shutil.copy if key == "cafile" else shutil.move)(paths[key], dst)
            out[key] = dst
        for f in (hub_dir, out_dir, *out.values()):
            os.chown(f, pw.pw_uid, pw.pw_gid)
        return out
