# jupyterhub_config.slurm.py — jupyter-gpubudget on a Slurm cluster.
#
# JupyterHub and the gpubudget service run on the cluster's gateway host: the one host
# allowed to submit into the `gpubudget` partition (slurm.conf AllocNodes=, see
# docs/backends.md "Slurm"). The core decides who runs where; Slurm runs it:
#   - notebooks: BudgetSpawner queues the session, then batchspawner's SlurmSpawner submits
#     the single-user server as a Slurm job *as the user*, with the core's nodes and GRES
#     (configure_slurmspawner below);
#   - batch jobs (`gpubudget submit`, REST): the service's SlurmBackend runs sbatch as the
#     user when the core starts them; preemption is scancel, resumable jobs are resubmitted
#     as their next attempt; nodes, GPU types and health come from `scontrol show node`.
# Before the first start: `gpubudget slurm sync-accounts --budgets <budgets.yaml>` (as a
# Slurm admin) creates the Slurm accounts the jobs are charged to.
#
# Places marked ADAPT are site choices. The tests (tests/slurm/) run this very file against a
# throw-away cluster, changing only what the environment below sets:
#   GPUBUDGET_HUB_DIR  GPUBUDGET_BUDGETS  GPUBUDGET_HUB_IP/PORT  GPUBUDGET_SERVICE_PORT
#   GPUBUDGET_PROXY_API_PORT  GPUBUDGET_HUB_API_PORT  GPUBUDGET_CYCLE_INTERVAL
#   GPUBUDGET_SLURM_PARTITION  GPUBUDGET_SLURM_GPU_MODELS (JSON: GRES type -> GPU model)
#   GPUBUDGET_SLURM_NODE_ADDRS (JSON: node -> address, for `slurmd -N` nodes on one host)
#   GPUBUDGET_SLURM_SUDO_KEEP_CONF=1 (sudo keeps SLURM_CONF; root only, for a private cluster)
#   GPUBUDGET_SLURM_UNRESPONSIVE_GRACE  GPUBUDGET_SLURM_USAGE_CHECK  GPUBUDGET_AUTHENTICATOR
#   GPUBUDGET_TEST_TOKEN (a "gpubudget-test" service with hub admin scopes, for tests)
import json
import os
import secrets
import sys
from pathlib import Path

from jupyter_gpubudget.core.accounts import load_budgets
from jupyter_gpubudget.service.auth import CUSTOM_SCOPES

c = get_config()  # noqa: F821 - provided by JupyterHub

env = os.environ.get
STATE = Path(env("GPUBUDGET_HUB_DIR", "/var/lib/jupyterhub")).resolve()       # ADAPT
STATE.mkdir(parents=True, exist_ok=True)
BUDGETS = Path(env("GPUBUDGET_BUDGETS", "/etc/gpubudget/budgets.yaml")).resolve()  # ADAPT
SERVICE_PORT = int(env("GPUBUDGET_SERVICE_PORT", "10101"))
BIN = Path(sys.executable).parent  # the environment with jupyterhub, batchspawner, gpubudget


def _secret(name: str) -> str:
    """A random token kept in the state directory (stable across restarts)."""
    p = STATE / name
    if not p.exists():
        p.write_text(secrets.token_hex(32))
        p.chmod(0o600)
    return p.read_text().strip()


budgets = load_budgets(BUDGETS.read_text(), str(BUDGETS))
users = set(budgets.admins)
for a in budgets.accounts.accounts.values():
    users |= set(a.members) | set(a.managers)

# ---------------------------------------------------------------- the hub
c.JupyterHub.bind_url = f"http://{env('GPUBUDGET_HUB_IP', '127.0.0.1')}:{env('GPUBUDGET_HUB_PORT', '8000')}"  # ADAPT: https behind your proxy
# the single-user servers run on compute nodes and must reach the hub's API: listen where
# they can, and tell them the gateway's cluster address
c.JupyterHub.hub_ip = env("GPUBUDGET_HUB_API_IP", "127.0.0.1")              # ADAPT: "0.0.0.0"
c.JupyterHub.hub_port = int(env("GPUBUDGET_HUB_API_PORT", "8081"))
# c.JupyterHub.hub_connect_ip = "gateway.cluster.example.org"                # ADAPT
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('GPUBUDGET_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"            # or PostgreSQL
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(STATE / "jupyterhub.pid")
# a Slurm job outlives a hub restart; the hub finds it again from its stored job id
c.JupyterHub.cleanup_servers = env("GPUBUDGET_CLEANUP_SERVERS", "0") != "0"

# ---------------------------------------------------------------- login
# Slurm runs jobs as the user's Unix account, so hub users are Unix users: PAM (or LDAP,
# or OAuth with usernames mapped to Unix names).
c.JupyterHub.authenticator_class = env("GPUBUDGET_AUTHENTICATOR", "pam")     # ADAPT
c.Authenticator.allowed_users = users
c.Authenticator.admin_users = set(budgets.admins)

# ---------------------------------------------------------------- Slurm settings (shared)
# One dict for both sides: the hub's configurer reads c.SlurmBackend, the service gets the
# same values on its command line.
SLURM = {
    "partition": env("GPUBUDGET_SLURM_PARTITION", "gpubudget"),                 # ADAPT
    # Slurm GPU GRES type -> GPU model known to the core (MIG tables, memory)
    "gpu_models": json.loads(env("GPUBUDGET_SLURM_GPU_MODELS",
                                 '{"h100": "H100-80GB", "a100": "A100-80GB"}')),  # ADAPT
    # core MIG profile -> the site's MIG GRES type (AutoDetect=nvml names them like this)
    "mig_types": {"1g.18gb": "nvidia_h200_1g.18gb", "3g.71gb": "nvidia_h200_3g.71gb"},  # ADAPT
    # budget project -> Slurm account where the names differ (sync-accounts creates them)
    "account_map": {},
    "time_headroom": 3600.0,
    # sbatch/scancel run as the job's user; needs the sudoers rule in docs/backends.md
    "user_command_prefix": ["sudo", "-n", "-u", "{user}", "--"],
    # scontrol update node (the core's drains) needs a Slurm admin: the slurm user here
    "admin_command_prefix": ["sudo", "-n", "-u", "slurm", "--"],                # ADAPT
    "unresponsive_grace": float(env("GPUBUDGET_SLURM_UNRESPONSIVE_GRACE", "60")),
    "usage_check_interval": float(env("GPUBUDGET_SLURM_USAGE_CHECK", "60")),
    "usage_threshold": float(env("GPUBUDGET_SLURM_USAGE_THRESHOLD", "30")),
    "watch_interval": float(env("GPUBUDGET_SLURM_WATCH", "5")),
}
if env("GPUBUDGET_SLURM_SUDO_KEEP_CONF") == "1":
    # a private cluster's SLURM_CONF must survive sudo (root may; for other service users
    # add `Defaults env_keep += "SLURM_CONF"` to sudoers instead)
    SLURM["user_command_prefix"] = ["sudo", "-n", "-u", "{user}",
                                    "--preserve-env=SLURM_CONF", "--"]
    SLURM["admin_command_prefix"] = []  # the test cluster's SlurmUser is root
for key, value in SLURM.items():
    setattr(c.SlurmBackend, key, value)

# ---------------------------------------------------------------- the gpubudget service
spawner_token = _secret("spawner-token")
service_cmd = [
    sys.executable, "-m", "jupyter_gpubudget.service",
    f"--budgets={BUDGETS}",
    f"--db=sqlite:///{STATE / 'ledger.sqlite'}",                  # ADAPT: PostgreSQL
    f"--cycle-interval={env('GPUBUDGET_CYCLE_INTERVAL', '10')}",
    "--GpuBudgetService.event_delay=0.01",
    # batch jobs run in Slurm; the inventory is Slurm's nodes (scontrol), not a file
    "--GpuBudgetService.backend_class=jupyter_gpubudget.backends.slurm.SlurmBackend",
]
# the service reads the same Slurm settings from a config file written here
service_config = STATE / "gpubudget_service_config.py"
service_config.write_text("c = get_config()  # noqa\n" + "".join(
    f"c.SlurmBackend.{k} = {v!r}\n" for k, v in SLURM.items()))
service_cmd.append(f"--config={service_config}")
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
c.JupyterHub.services = [
    {"name": "gpubudget", "url": f"http://127.0.0.1:{SERVICE_PORT}", "oauth_no_confirm": True,
     "command": service_cmd, "cwd": str(STATE),
     # "user": "gpubudget",   # ADAPT: with the hub running as root, run the service as its
     #                          own user (the sudoers rules in docs/backends.md name it)
     # the service runs Slurm commands: it needs the Slurm client configuration
     "environment": {k: v for k, v in os.environ.items() if k in ("SLURM_CONF", "PATH")}},
    {"name": "gpubudget-spawner", "api_token": spawner_token},
]
roles = [
    {"name": "user", "scopes": ["self", "custom:gpubudget:submit", "custom:gpubudget:manage",
                                "access:services!service=gpubudget"]},
    {"name": "gpubudget-admin", "users": sorted(budgets.admins),
     "scopes": ["admin-ui", "admin:users", "admin:servers", "custom:gpubudget:admin",
                "access:services!service=gpubudget"]},
    {"name": "gpubudget-spawner", "services": ["gpubudget-spawner"],
     "scopes": ["custom:gpubudget:admin"]},
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                  "custom:gpubudget:read", "access:services!service=gpubudget"]},
]
if env("GPUBUDGET_TEST_TOKEN"):
    c.JupyterHub.services.append({"name": "gpubudget-test",
                                  "api_token": env("GPUBUDGET_TEST_TOKEN")})
    roles.append({"name": "gpubudget-test", "services": ["gpubudget-test"],
                  "scopes": ["admin:users", "tokens", "admin:servers", "read:servers",
                             "admin:server_state", "custom:gpubudget:admin",
                             "access:services!service=gpubudget"]})
c.JupyterHub.load_roles = roles

# ---------------------------------------------------------------- notebooks: BudgetSpawner + SlurmSpawner
# importing batchspawner registers the hub API route (/hub/api/batchspawner) through which the
# server in the job reports its port; the hub only imports the spawner it runs itself
# (BudgetSpawner), so import it here, before the hub builds its routes
import batchspawner  # noqa: E402,F401

c.JupyterHub.spawner_class = "jupyter_gpubudget.hub.BudgetSpawner"
node_addrs = json.loads(env("GPUBUDGET_SLURM_NODE_ADDRS", "{}"))
if node_addrs:  # node names that do not resolve (several slurmd -N on one host)
    c.BudgetSpawner.backend_spawner_class = "batchspawner.MultiSlurmSpawner"
    c.MultiSlurmSpawner.daemon_resolver = node_addrs
else:
    c.BudgetSpawner.backend_spawner_class = "batchspawner.SlurmSpawner"
c.BudgetSpawner.child_configurer = "jupyter_gpubudget.backends.slurm:configure_slurmspawner"
c.BudgetSpawner.service_api_url = f"http://127.0.0.1:{SERVICE_PORT}/services/gpubudget/api/v1"
c.BudgetSpawner.service_token = spawner_token
c.BudgetSpawner.max_queue_wait = float(env("GPUBUDGET_MAX_QUEUE_WAIT", str(4 * 3600)))
c.BudgetSpawner.backend_start_timeout = 300     # a Slurm job may take a while to start
c.BudgetSpawner.heartbeat_interval = float(env("GPUBUDGET_HEARTBEAT", "30"))
c.BudgetSpawner.queue_poll_interval = float(env("GPUBUDGET_QUEUE_POLL", "2"))
c.BudgetSpawner.default_min_runtime = "2h"
c.BudgetSpawner.use_nvml = False                # the GPUs are on the compute nodes
# batchspawner: sbatch/squeue/scancel as the user (sudoers rule in docs/backends.md); the
# server runs in the job through batchspawner-singleuser, which reports its port
c.SlurmSpawner.exec_prefix = "sudo -E -u {username}"
# the commands as the compute nodes have them (a shared software path, a module, a venv)
JOB_BIN = Path(env("GPUBUDGET_SLURM_JOB_BIN", str(BIN)))                     # ADAPT
c.SlurmSpawner.batchspawner_singleuser_cmd = str(JOB_BIN / "batchspawner-singleuser")
c.SlurmSpawner.startup_poll_interval = 0.5
c.Spawner.cmd = [str(JOB_BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120
c.Spawner.poll_interval = int(env("GPUBUDGET_POLL_INTERVAL", "30"))
if env("GPUBUDGET_SERVER_IP"):  # where the single-user server listens (default: all)
    c.Spawner.args = [f"--ServerApp.ip={env('GPUBUDGET_SERVER_IP')}"]
if env("SLURM_CONF"):  # a Slurm configuration outside /etc/slurm must reach sbatch & co.
    c.Spawner.environment = {"SLURM_CONF": env("SLURM_CONF")}
