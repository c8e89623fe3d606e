"""What `make run` leaves on the machine, and `make clean-demo`: as root, each checkout's demo
users get homes of their own (two clones never share a lab layout or files), a file an
earlier run left there owned by root is the user's again at the next start (a user's own
`job.yaml` was unwritable), and the clean-up removes the accounts, homes, group and sudoers
drop-in the demo made.

Real accounts, real useradd/userdel and visudo: every name here is this test's own (its
prefix, service account, group and home root: the environment variables demo_setup reads),
so the demos other tests run at the same time are never touched. Each step runs in a
subprocess, as the hub's configuration does, so the names are read as a hub reads them."""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_gpubudget.hub.demo_setup import demo_home_root

ROOT = Path(__file__).resolve().parents[2]

SETUP = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from jupyter_gpubudget.hub import demo_setup as d
    state = Path(sys.argv[1])
    svc = d.ensure_service_user()
    homes = d.demo_home_root(Path(sys.argv[2]))
    names = [d.DEMO_PREFIX + u for u in ("alice", "bob")]
    for n in names:
        d.ensure_demo_home(homes, d.ensure_user(n, home_root=homes))
    d.ensure_users_group(names)
    jobs = state / "jobs"
    d.private_dir(jobs, 0, svc.pw_gid, 0o750)
    cfg = d.launcher_config(state, jobs, d.SERVICE_USER, Path(sys.executable).parent,
                            allowed_groups=[d.USERS_GROUP], workdir=str(homes / "{user}"))
    d.install_sudoers(d.SERVICE_USER, sys.executable, cfg, users_group=d.USERS_GROUP)
    print(homes)
    sys.stdout.flush()
    os._exit(0)  # as a killed hub: its drop-in is left behind
""")

BUDGETS = """\
admins: [alice]
accounts:
  physics:
    grant: 10
    children:
      lattice-qcd: {grant: 10, members: [alice, bob]}
"""


@pytest.fixture
def names(tmp_path):
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the demo's accounts are made as root: run the suite as root")
        pytest.skip("needs root (useradd)")
    tag = "gbt" + secrets.token_hex(3)
    env = dict(os.environ, GPUBUDGET_DEMO_PREFIX=f"{tag}-", GPUBUDGET_DEMO_SERVICE_USER=f"{tag}svc",
               GPUBUDGET_DEMO_USERS_GROUP=f"{tag}users")
    state = Path("/tmp") / f"{tag}-state"  # (the launcher's config: under a root-only path)
    state.mkdir(mode=0o755)
    yield tag, env, state
    for n in (f"{tag}-alice", f"{tag}-bob", f"{tag}svc"):  # whatever a failure left
        subprocess.run(["userdel", "-r", n], capture_output=True)
    subprocess.run(["groupdel", f"{tag}users"], capture_output=True)
    subprocess.run(["rm", "-rf", str(state)])
    for checkout in ("/tmp/clone-one", "/tmp/clone-two"):
        env_root = demo_home_root(Path(checkout + tag))
        subprocess.run(["rm", "-rf", str(env_root)])


def setup(env: dict, state: Path, checkout: str) -> Path:
    r = subprocess.run([sys.executable, "-c", SETUP, str(state), checkout], env=env,
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def owned_by_root(home: Path) -> list[str]:
    out = []
    for dirpath, dirs, files in os.walk(home):
        out += [os.path.join(dirpath, n) for n in [*dirs, *files]
                if os.lstat(os.path.join(dirpath, n)).st_uid == 0]
    return out


def test_two_clones_have_their_own_homes_and_nothing_stays_roots(names, tmp_path):
    tag, env, state = names
    one, two = f"/tmp/clone-one{tag}", f"/tmp/clone-two{tag}"
    assert demo_home_root(Path(one)) != demo_home_root(Path(two))
    assert demo_home_root(Path(one)) == demo_home_root(Path(one))  # stable
    homes_one = setup(env, state, one)
    alice = pwd.getpwnam(f"{tag}-alice")
    home = homes_one / alice.pw_name
    assert home.is_dir() and os.stat(home).st_uid == alice.pw_uid
    assert oct(os.stat(home).st_mode & 0o777) == "0o700"
    # an earlier run (a test as root, a root shell) left root's files in the home
    (home / "job.yaml").write_text("written by root\n")
    (home / ".jupyter" / "lab").mkdir(parents=True)
    (home / ".jupyter" / "lab" / "workspaces").write_text("{}")
    outside = tmp_path / "roots-own"
    outside.write_text("root's")
    (home / "link").symlink_to(outside)  # a link is given back, never what it points to
    assert owned_by_root(home)

    homes_two = setup(env, state, two)  # `make run` from a second clone
    assert homes_two != homes_one
    assert not (homes_two / alice.pw_name / "job.yaml").exists()  # its own home
    setup(env, state, one)  # `make run` again from the first
    assert owned_by_root(home) == []
    assert os.stat(outside).st_uid == 0
    r = subprocess.run(["runuser", "-u", alice.pw_name, "--", "sh", "-c",
                        f"echo 'project: lattice-qcd' > {home}/job.yaml"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # the user's own job.yaml is writable


def test_clean_demo_removes_the_accounts_homes_group_and_drop_in(names, tmp_path):
    tag, env, state = names
    checkout = f"/tmp/clone-one{tag}"
    homes = setup(env, state, checkout)
    from jupyter_gpubudget.hub.demo_setup import sudoers_path

    drop_in = sudoers_path(state / "launcher.json")
    assert drop_in.exists()  # left by the killed hub
    assert grp.getgrnam(f"{tag}users")
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    env = dict(env, GPUBUDGET_DEMO_HOMES=str(homes))
    r = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.hub.demo_setup", "clean",
                        "--dir", str(state), "--budgets", str(budgets)],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for n in (f"{tag}-alice", f"{tag}-bob", f"{tag}svc"):
        with pytest.raises(KeyError):
            pwd.getpwnam(n)
    with pytest.raises(KeyError):
        grp.getgrnam(f"{tag}users")
    assert not homes.exists()
    assert not drop_in.exists()
    # a second clean has nothing left to do and says it is done
    r = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.hub.demo_setup", "clean",
                        "--dir", str(state), "--budgets", str(budgets)],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cleaning_two_clones_one_after_the_other_leaves_neither_s_homes(names, tmp_path):
    # the accounts are the machine's, the homes each checkout's: the first clean removes the
    # accounts, and the second must still find and remove its own homes (owned by accounts
    # that are gone by then)
    tag, env, state = names
    homes = [setup(env, state, f"/tmp/clone-one{tag}"), setup(env, state, f"/tmp/clone-two{tag}")]
    assert all(h.is_dir() for h in homes)
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text(BUDGETS)
    for h in homes:
        r = subprocess.run([sys.executable, "-m", "jupyter_gpubudget.hub.demo_setup", "clean",
                            "--dir", str(state), "--budgets", str(budgets)],
                           env=dict(env, GPUBUDGET_DEMO_HOMES=str(h)), capture_output=True,
                           text=True, cwd=ROOT)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not h.exists(), (r.stdout, sorted(p.name for p in h.iterdir()))
    with pytest.raises(KeyError):
        pwd.getpwnam(f"{tag}-alice")


def test_a_bad_demo_name_is_refused_before_anything_is_made(tmp_path):
    env = dict(os.environ, GPUBUDGET_DEMO_PREFIX="Demo;rm -rf /")
    r = subprocess.run([sys.executable, "-c", "import jupyter_gpubudget.hub.demo_setup"],
                       env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "GPUBUDGET_DEMO_PREFIX" in r.stderr, r.stderr
