"""The lab's terminals find the ``gpubudget`` CLI whatever their shell's profile does to PATH
(serverext/terminal.py): real shells (bash, dash as sh, zsh) started as jupyter_server_terminals
starts them from a JupyterHub-spawned server (``$SHELL -l``), with this machine's
/etc/profile and a home whose profile files set PATH from scratch — before the rewrite the
CLI is not found, after it it is, and the profile still ran (its variable is set)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jupyter_gpubudget.serverext.terminal import scripts_dir, terminal_command
from tests.hub.hubproc import require

RESET = 'PATH=/usr/bin:/bin\nexport PATH\nPROFILE_RAN=yes\nexport PROFILE_RAN\n'


def _run(argv: list[str], home: Path) -> str:
    env = {"HOME": str(home), "PATH": scripts_dir() + ":/usr/bin:/bin", "TERM": "dumb",
           "SHELL": argv[0], "ZDOTDIR": str(home)}
    r = subprocess.run(argv, input='echo "found=$(command -v gpubudget) profile=$PROFILE_RAN"\n'
                       "exit\n", env=env, capture_output=True, text=True, timeout=60,
                       cwd=home)
    return r.stdout


@pytest.mark.parametrize("name", ["bash", "sh", "dash", "zsh"])
def test_a_login_shell_finds_the_cli_after_its_profile_reset_path(name, tmp_path):
    shell = shutil.which(name, path="/usr/bin:/bin")
    require(shell is not None, f"{name} (apt-get install -y {name})")
    assert shutil.which("gpubudget", path=scripts_dir())  # installed where we point
    for f in (".profile", ".bash_profile", ".zprofile", ".zlogin"):  # login files only
        (tmp_path / f).write_text(RESET)
    before = _run([shell, "-l"], tmp_path)  # what a terminal ran until now
    assert "found= " in before and "profile=yes" in before, before
    after = _run(terminal_command([shell, "-l"], [scripts_dir()]), tmp_path)
    assert f"found={scripts_dir()}/gpubudget profile=yes" in after, after


def test_the_system_profile_alone_resets_path_and_is_undone(tmp_path):
    """No profile of the user's: /etc/profile (Debian's sets PATH) is what removed it."""
    shell = shutil.which("bash", path="/usr/bin:/bin")
    assert shell
    if os.path.exists("/etc/profile") and "PATH=" not in Path("/etc/profile").read_text():
        pytest.fail("this machine's /etc/profile does not set PATH: the test proves nothing")
    assert "found= " in _run([shell, "-l"], tmp_path)
    out = _run(terminal_command([shell, "-l"], [scripts_dir()]), tmp_path)
    assert f"found={scripts_dir()}/gpubudget" in out, out


def test_what_cannot_be_rewritten_safely_is_left_alone():
    d = ["/opt/env/bin"]
    assert terminal_command(["/usr/bin/fish", "-l"], d) == ["/usr/bin/fish", "-l"]
    assert terminal_command(["bash", "--norc", "-l"], d) == ["bash", "--norc", "-l"]
    assert terminal_command([], d) == []
    assert terminal_command(["/bin/bash", "-l"], [])[1:] == ["-l"]
    new = terminal_command(["/bin/bash", "-l"], ["/a", "/b"])
    assert new[:3] == ["/bin/bash", "-l", "-c"] and new[4:] == ["/bin/bash", "/b", "/a"]
    assert terminal_command(["/bin/zsh"], d)[1] == "-c"  # not a login shell: stays one
