# jupyterhub_config.py — the embedded DEMO hub of jupyter-gpubudget (`make run`, `gpubudget hub`).
#
# Local processes, SQLite, a declared demo inventory (two 8-GPU H100 nodes, two GPUs
# MIG-partitioned: no GPU needed), the gpubudget service managed by the hub, and a DEMO-ONLY
# shared-password authenticator. For a real deployment start from
# hub_config/jupyterhub_config.production.py.
#
# Every knob can be changed through the environment (the tests use this same file):
#   GPUBUDGET_HUB_DIR        state directory (hub DB, ledger, cookie secret, tokens)  [.gpubudget-hub]
#   GPUBUDGET_BUDGETS        budgets YAML                                   [examples/budgets-demo.yaml]
#   GPUBUDGET_INVENTORY      declared inventory YAML                        [examples/inventory-demo.yaml]
#   GPUBUDGET_INVENTORY_SOURCE  declared, nvml or auto (NVML if a driver)   [declared]
#   GPUBUDGET_HUB_IP / GPUBUDGET_HUB_PORT                public address      [127.0.0.1 / 8000]
#   GPUBUDGET_SERVICE_PORT / GPUBUDGET_PROXY_API_PORT / GPUBUDGET_HUB_API_PORT   [10101 / 8001 / 8081]
#   GPUBUDGET_CYCLE_INTERVAL scheduling timer, seconds                      [5]
#   GPUBUDGET_MAX_QUEUE_WAIT longest wait in the queue, seconds             [1800]
#   GPUBUDGET_IDLE_LIMIT     idle limit, seconds (0: off)                   [3600]
#   GPUBUDGET_POLL_INTERVAL  JupyterHub poll interval for servers, seconds  [30]
#   GPUBUDGET_HEARTBEAT      spawner heartbeat to the service, seconds      [10]
#   GPUBUDGET_TEST_TOKEN     if set: a "gpubudget-test" service with this token and hub admin
#                            scopes (for tests driving the REST API)
#   GPUBUDGET_IDLE_ACTION    unprotect or hibernate (BudgetSpawner.idle_action)  [unprotect]
#   GPUBUDGET_SNAPSHOT_METHODS  snapshot methods of the servers, in order       [criu,namespace]
#   GPUBUDGET_CRIU           the CRIU binary the servers use (else found on PATH / in the cache)
#   GPUBUDGET_SNAPSHOT_ON_PREEMPT  0: preemption stops a server without saving its kernels [1]
#   GPUBUDGET_PREEMPT_NOTICE seconds JupyterLab warns before a preempted server stops  [60]
#   GPUBUDGET_CLUSTERS       several clusters under one budget tree, each a declared inventory
#                            run by the local backend: NAME=INVENTORY.yaml[,NAME=...]  [one]
#   GPUBUDGET_HUB_EXTRA_CONFIG  a jupyterhub_config.py of yours, loaded last (your changes
#                            on top of the demo's: e.g. c.BudgetSpawner.cluster_spawners)
#   GPUBUDGET_ISOLATION      1: as root, run the service and every user as separate Unix
#                            accounts (below); 0: everything as the hub's user   [1]
#
# Who runs as whom (see "Security model" in docs/service.md). Started as root, the demo creates
# (if missing) the system account `gpubudget` for the service, one account `demo-<name>` per
# demo user for their notebook servers and batch jobs (their homes are this checkout's own:
# /home/gpubudget-demo-<hash of the checkout's path>/demo-<name>), the launcher's
# root-owned config (<state>/launcher.json) and a sudoers drop-in (/etc/sudoers.d/gpubudget-*,
# removed when the hub exits) letting `gpubudget` run exactly the launcher as root
# (`make clean-demo` removes them all). Started as
# another user, or when the checkout is not readable by other accounts, everything runs as the
# invoking user and the log says that isolation is off.
import os
import secrets
import sys
from pathlib import Path

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.hub import demo_setup
from jupyter_gpubudget.hub.form import TEMPLATES as GPUBUDGET_TEMPLATES
from jupyter_gpubudget.hub.handlers import admin_landing
from jupyter_gpubudget.hub.handlers import register_handlers as register_gpubudget_handlers
from jupyter_gpubudget.service.auth import CUSTOM_SCOPES

c = get_config()  # noqa: F821 - provided by JupyterHub

os.umask(0o077)  # the hub's files (its database, cookie secret, tokens) are root's alone
ROOT = Path(__file__).resolve().parent.parent
env = os.environ.get
STATE = Path(env("GPUBUDGET_HUB_DIR", ".gpubudget-hub")).resolve()
STATE.mkdir(parents=True, exist_ok=True)
STATE.chmod(0o755)  # traversable: the service and users reach their own parts below it
for f in ("jupyterhub.sqlite", "jupyterhub_cookie_secret"):  # from older runs: private now
    if (STATE / f).exists():
        (STATE / f).chmod(0o600)
BUDGETS = Path(env("GPUBUDGET_BUDGETS", str(ROOT / "examples" / "budgets-demo.yaml"))).resolve()
INVENTORY = Path(env("GPUBUDGET_INVENTORY",
                     str(ROOT / "examples" / "inventory-demo.yaml"))).resolve()
HUB_IP = env("GPUBUDGET_HUB_IP", "127.0.0.1")
HUB_PORT = int(env("GPUBUDGET_HUB_PORT", "8000"))
SERVICE_PORT = int(env("GPUBUDGET_SERVICE_PORT", "10101"))
BIN = Path(sys.executable).parent


def _secret(name: str) -> str:
    """A random token kept in the state directory (stable across restarts)."""
    p = STATE / name
    if not p.exists():
        p.write_text(secrets.token_hex(32))
        p.chmod(0o600)
    return p.read_text().strip()


budgets = load_budgets(BUDGETS.read_bytes(), str(BUDGETS))
tree = budgets.accounts
users = set(budgets.admins)
for a in tree.accounts.values():
    users |= set(a.members) | set(a.managers)

# ---------------------------------------------------------------- who runs as whom
UNIX_TEMPLATE = demo_setup.DEMO_PREFIX + "{username}"
ISOLATION_OFF = ("GPUBUDGET_ISOLATION=0" if env("GPUBUDGET_ISOLATION", "1") == "0" else
                 demo_setup.isolation_problem([ROOT / "jupyter_gpubudget" / "__init__.py",
                                               BUDGETS, INVENTORY, STATE], state=STATE))
if ISOLATION_OFF is None:
    svc_user = demo_setup.ensure_service_user()
    HOMES = demo_setup.demo_home_root()  # this checkout's homes of the demo users
    for u in sorted(users):
        demo_setup.ensure_demo_home(HOMES, demo_setup.ensure_user(
            UNIX_TEMPLATE.format(username=u), home_root=HOMES))
    SERVICE_DIR = STATE / "service"  # the ledger: the service's user alone
    demo_setup.private_dir(SERVICE_DIR, svc_user.pw_uid, svc_user.pw_gid, 0o700)
    demo_setup.move_old_ledger(STATE, SERVICE_DIR, svc_user)
    JOBS = STATE / "jobs"  # job records: root's, readable by the service's group
    demo_setup.private_dir(JOBS, 0, svc_user.pw_gid, 0o750)
    demo_setup.ensure_users_group([UNIX_TEMPLATE.format(username=u) for u in sorted(users)])
    # jobs run as the demo's users only, never as another account of the machine
    LAUNCHER = demo_setup.launcher_config(STATE, JOBS, demo_setup.SERVICE_USER, BIN,
                                          allowed_groups=[demo_setup.USERS_GROUP],
                                          workdir=str(HOMES / "{user}"))
    demo_setup.install_sudoers(demo_setup.SERVICE_USER, sys.executable, LAUNCHER,
                               users_group=demo_setup.USERS_GROUP)
    print(f"gpubudget demo: the service runs as {demo_setup.SERVICE_USER!r}; notebook servers "
          f"and batch jobs run as {UNIX_TEMPLATE.format(username='<user>')!r}",
          file=sys.stderr, flush=True)
else:
    SERVICE_DIR, JOBS = STATE, STATE / "jobs"
    print(f"gpubudget demo: ISOLATION IS OFF ({ISOLATION_OFF}): the service, every notebook "
          "server and every batch job run as the hub's own Unix user. Fine for a demo on your "
          "own machine, never on a shared one (see 'Security model' in docs/service.md).",
          file=sys.stderr, flush=True)

# ---------------------------------------------------------------- the hub itself
c.JupyterHub.bind_url = f"http://{HUB_IP}:{HUB_PORT}"
c.JupyterHub.hub_port = int(env("GPUBUDGET_HUB_API_PORT", "8081"))
# a server that leaves the queue never had a route: removing it is not an error in the log
c.JupyterHub.proxy_class = "jupyter_gpubudget.hub.proxy.QuietProxy"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('GPUBUDGET_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
# stop the users' servers when the hub stops (each stop ends the session's charge); set
# GPUBUDGET_CLEANUP_SERVERS=0 to keep them running across a hub restart
c.JupyterHub.cleanup_servers = env("GPUBUDGET_CLEANUP_SERVERS", "1") != "0"
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": float(env("GPUBUDGET_SLOW_SPAWN", "10"))}

# ---------------------------------------------------------------- DEMO-ONLY login
# Anyone who knows the shared password can log in as any user of the budgets file.
c.JupyterHub.authenticator_class = "jupyter_gpubudget.hub.demo_auth.DemoAuthenticator"
c.Authenticator.allowed_users = users
c.Authenticator.admin_users = set(budgets.admins)
# an admin lands on the gpubudget admin pages (accounts, queue, nodes); everyone else on the
# spawn form or their running server
c.JupyterHub.default_url = admin_landing(sorted(budgets.admins))
c.JupyterHub.template_vars = {
    "announcement_login": (
        "<b>gpubudget DEMO</b> — not secure. Log in as one of "
        + ", ".join(sorted(users)) + " with the password <code>gpubudget-demo</code>."),
}

# ---------------------------------------------------------------- the gpubudget service
spawner_token = _secret("spawner-token")
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
service = {
    "name": "gpubudget",
    "url": f"http://127.0.0.1:{SERVICE_PORT}",
    "oauth_no_confirm": True,
    # what a browser logged in to the service may do (never more than the user's own
    # scopes); state changes by cookie need JupyterHub's XSRF token
    "oauth_client_allowed_scopes": sorted(CUSTOM_SCOPES),
    "command": [sys.executable, "-m", "jupyter_gpubudget.service",
                f"--budgets={BUDGETS}", f"--inventory={INVENTORY}",
                # the demo schedules on its declared inventory; set "auto" to use this
                # machine's GPUs through NVML when it has a driver
                "--GpuBudgetService.inventory_source="
                + env("GPUBUDGET_INVENTORY_SOURCE", "declared"),
                f"--jobs-dir={JOBS}",
                f"--cycle-interval={env('GPUBUDGET_CYCLE_INTERVAL', '5')}",
                # a spawn is an event: schedule it almost at once
                "--GpuBudgetService.event_delay=0.01",
                "--GpuBudgetService.preempt_notice_time="
                + env("GPUBUDGET_PREEMPT_NOTICE", "60")],
    "cwd": str(SERVICE_DIR),
    # the ledger URL (a PostgreSQL one carries a password) stays out of the command line,
    # which JupyterHub logs
    "environment": {"GPUBUDGET_DB_URL": f"sqlite:///{SERVICE_DIR / 'ledger.sqlite'}"},
}
if ISOLATION_OFF is None:
    service["user"] = demo_setup.SERVICE_USER  # JupyterHub starts it as this account
    service["command"] += [f"--LocalBackend.launcher_config={LAUNCHER}",
                           f"--LocalBackend.unix_user_template={UNIX_TEMPLATE}"]
elif os.geteuid() == 0:  # a root service still never runs a job as root
    for u in sorted(users):
        demo_setup.ensure_user(UNIX_TEMPLATE.format(username=u))
    service["command"] += [f"--LocalBackend.unix_user_template={UNIX_TEMPLATE}"]
else:  # not root: no cgroup can be made; every job is this one account's own (UNSAFE, logged)
    service["command"] += ["--LocalBackend.contain=False"]
    print("gpubudget demo: not root, so jobs are not contained in cgroups (a job's processes "
          "that leave its process group may outlive it); run as root for containment",
          file=sys.stderr)
if env("GPUBUDGET_CLUSTERS"):  # several named clusters, one budget tree (docs/service.md)
    clusters = {}
    for part in env("GPUBUDGET_CLUSTERS").split(","):
        name, _, path = part.strip().partition("=")
        if not name or not path or not Path(path).is_file():
            raise SystemExit(f"GPUBUDGET_CLUSTERS: expected NAME=INVENTORY.yaml[,...] with "
                             f"existing files, got {part.strip()!r}")
        copy = SERVICE_DIR / f"inventory-{name}.yaml"  # where the service's account reads it
        copy.write_text(Path(path).read_text())
        copy.chmod(0o644)
        clusters[name] = {"backend": "local", "inventory": str(copy)}
    clusters_config = SERVICE_DIR / "clusters_config.py"
    clusters_config.write_text(f"c.GpuBudgetService.clusters = {clusters!r}\n")
    clusters_config.chmod(0o644)
    service["command"].append(f"--config={clusters_config}")
c.JupyterHub.services = [
    service,
    # BudgetSpawner (inside the hub) talks to the service with this token
    {"name": "gpubudget-spawner", "api_token": spawner_token},
]
roles = [
    {"name": "gpubudget-user", "users": sorted(users - set(budgets.admins)),
     "scopes": ["self", "custom:gpubudget:submit", "custom:gpubudget:manage",
                "access:services!service=gpubudget"]},
    {"name": "gpubudget-admin", "users": sorted(budgets.admins),
     "scopes": ["admin-ui", "admin:users", "admin:servers", "custom:gpubudget:admin",
                "access:services!service=gpubudget"]},
    {"name": "gpubudget-spawner", "services": ["gpubudget-spawner"],
     "scopes": ["custom:gpubudget:admin"]},
    # the service reconciles sessions with the hub's servers when it starts (a server stopped
    # during the hub's shutdown, after the service, left its stop in the spawner's state), and
    # starts a preempted session's server again once it is requeued (`servers`)
    {"name": "gpubudget-service", "services": ["gpubudget"],
     "scopes": ["list:users", "read:servers", "admin:server_state", "servers"]},
    # the user's own server reads budgets and cancels the user's queued work (the JupyterLab
    # sidebar, through the gpubudget server extension)
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                  "custom:gpubudget:read", "custom:gpubudget:submit",
                                  "access:services!service=gpubudget"]},
]
if env("GPUBUDGET_TEST_TOKEN"):
    c.JupyterHub.services.append({"name": "gpubudget-test", "api_token": env("GPUBUDGET_TEST_TOKEN")})
    roles.append({"name": "gpubudget-test", "services": ["gpubudget-test"],
                  "scopes": ["admin:users", "admin:servers", "read:servers", "admin:server_state",
                             "tokens",
                             "custom:gpubudget:admin", "access:services!service=gpubudget"]})
c.JupyterHub.load_roles = roles

# ---------------------------------------------------------------- BudgetSpawner, local backend
c.JupyterHub.spawner_class = "jupyter_gpubudget.hub.BudgetSpawner"  # entry point: "gpubudget"
if ISOLATION_OFF is None:  # each user's server runs as their own Unix account
    c.BudgetSpawner.backend_spawner_class = "jupyter_gpubudget.hub.localuser.MappedLocalProcessSpawner"
    c.MappedLocalProcessSpawner.unix_user_template = UNIX_TEMPLATE
    c.MappedLocalProcessSpawner.home_dir_template = str(HOMES / "{unix_user}")
else:
    c.BudgetSpawner.backend_spawner_class = "jupyterhub.spawner.SimpleLocalProcessSpawner"
c.BudgetSpawner.service_api_url = f"http://127.0.0.1:{SERVICE_PORT}/services/gpubudget/api/v1"
c.BudgetSpawner.service_token = spawner_token
c.BudgetSpawner.max_queue_wait = float(env("GPUBUDGET_MAX_QUEUE_WAIT", "1800"))
c.BudgetSpawner.idle_limit = float(env("GPUBUDGET_IDLE_LIMIT", "3600"))
c.BudgetSpawner.heartbeat_interval = float(env("GPUBUDGET_HEARTBEAT", "10"))
c.BudgetSpawner.queue_poll_interval = float(env("GPUBUDGET_QUEUE_POLL", "2"))
c.BudgetSpawner.idle_action = env("GPUBUDGET_IDLE_ACTION", "unprotect")
c.BudgetSpawner.snapshot_on_preempt = env("GPUBUDGET_SNAPSHOT_ON_PREEMPT", "1") != "0"
c.Spawner.poll_interval = int(env("GPUBUDGET_POLL_INTERVAL", "30"))
# the spawn form's live quote (a hub handler: the page has only the hub's cookie) and the
# queue page (JupyterHub's spawn-pending page with the place in the queue and "Leave queue")
register_gpubudget_handlers()
c.JupyterHub.template_paths = [str(GPUBUDGET_TEMPLATES)]
c.SimpleLocalProcessSpawner.home_dir_template = str(STATE / "home" / "{username}")
c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 60
# JupyterLab: no news popup in the demo (an admin override every user reads; each user's own
# settings stay in their home)
lab_app_settings = STATE / "lab-app-settings"
lab_app_settings.mkdir(exist_ok=True)
lab_app_settings.chmod(0o755)
(lab_app_settings / "overrides.json").write_text(
    '{"@jupyterlab/apputils-extension:notification": '
    '{"fetchNews": "false", "checkForUpdates": false}}\n')
(lab_app_settings / "overrides.json").chmod(0o644)
c.Spawner.args = [f"--LabApp.app_settings_dir={lab_app_settings}"]
if ISOLATION_OFF is not None and os.geteuid() == 0:
    c.Spawner.args.append("--allow-root")
c.Spawner.environment = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                         # where the server extension (and the CLI) reach the service
                         "GPUBUDGET_URL": f"http://127.0.0.1:{SERVICE_PORT}/services/gpubudget"}
for _k in ("GPUBUDGET_SNAPSHOT_METHODS", "GPUBUDGET_CRIU"):  # snapshots (docs/snapshot.md)
    if env(_k):
        c.Spawner.environment[_k] = env(_k)

if env("GPUBUDGET_HUB_EXTRA_CONFIG"):  # an admin's changes on top of the demo's: run with
    # this `c`, so it reads and changes the demo's values (c.Spawner.environment, ...)
    import runpy

    runpy.run_path(env("GPUBUDGET_HUB_EXTRA_CONFIG"), init_globals={"c": c, "get_config": lambda: c})
