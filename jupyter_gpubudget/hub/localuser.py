"""``MappedLocalProcessSpawner``: JupyterHub's LocalProcessSpawner (the server runs as a Unix
account, with that account's HOME and SHELL) where the account is given by a template or a map
instead of being the hub user's name, and is never root or a system account.

The same mapping as the batch jobs' (``LocalBackend.unix_user_template`` / ``unix_users``):
configure both alike, e.g. ``c.MappedLocalProcessSpawner.unix_user_template = "demo-{username}"``.
"""

from __future__ import annotations

import os
import pwd
import shutil
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from tornado import web
from traitlets import Dict, Integer, Unicode


class MappedLocalProcessSpawner(LocalProcessSpawner):
    unix_user_template = Unicode(
        "{username}", config=True,
        help="The Unix account a hub user's server runs as; {username} is the hub user name.")
    unix_users = Dict({}, config=True, help="Hub user name -> Unix account (overrides the "
                                            "template for those users).")
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

    def make_preexec_fn(self, name: str) -> Any:
        self.account()
        return super().make_preexec_fn(self.unix_name)

    def user_env(self, env: dict) -> dict:
        pw = self.account()
        env["USER"] = pw.pw_name
        if pw.pw_dir:
            env["HOME"] = pw.pw_dir
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
