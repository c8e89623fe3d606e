# jupyterhub_config.production.py — an example of a real deployment of jupyter-gpubudget on
# one GPU server (local processes, real Unix users, NVML inventory). Copy it, then adapt the
# places marked ADAPT. On a Slurm cluster start from jupyterhub_config.slurm.py instead
# (docs/backends.md).
import os
import sys

from jupyter_gpubudget.service.auth import CUSTOM_SCOPES

c = get_config()  # noqa: F821 - provided by JupyterHub

os.umask(0o077)  # the hub's own files (database, cookie secret) are root's alone

# ---------------------------------------------------------------- hub, proxy, database
c.JupyterHub.bind_url = "https://gpu.example.org"            # ADAPT (TLS terminates here,
c.JupyterHub.ssl_cert = "/etc/jupyterhub/tls/cert.pem"       #  or in front of the proxy)
c.JupyterHub.ssl_key = "/etc/jupyterhub/tls/key.pem"
c.JupyterHub.db_url = "postgresql://jupyterhub@db.example.org/jupyterhub"   # or sqlite:///...
c.JupyterHub.cookie_secret_file = "/var/lib/jupyterhub/cookie_secret"

# ---------------------------------------------------------------- login: a REAL authenticator
# e.g. oauthenticator (GitHub/GitLab/OIDC), ldapauthenticator, or PAM (the default).
c.JupyterHub.authenticator_class = "pam"                      # ADAPT
c.Authenticator.admin_users = {"root"}                        # hub admins (not budget admins)
c.Authenticator.allow_existing_users = True

# ---------------------------------------------------------------- the gpubudget service
# Managed by the hub: started, restarted and routed at /services/gpubudget/. It owns the
# ledger (PostgreSQL recommended for production), runs the scheduling loop, serves /api/v1.
# It runs as the unprivileged account `gpubudget`; batch jobs run as their users' accounts
# through the launcher (root-owned /etc/gpubudget/launcher.json and one sudoers line): see
# "Security model" in docs/service.md for the exact set-up — set its "allowed_groups" to
# your users' group, or the service's account may start jobs as any account with uid >= 1000.
SPAWNER_TOKEN = os.environ["GPUBUDGET_SPAWNER_TOKEN"]  # ADAPT: `openssl rand -hex 32`, kept secret
c.JupyterHub.custom_scopes = CUSTOM_SCOPES
c.JupyterHub.services = [
    {
        "name": "gpubudget",
        "url": "http://127.0.0.1:10101",
        "oauth_no_confirm": True,
        "user": "gpubudget",                  # never root
        "cwd": "/var/lib/gpubudget",
        "command": [sys.executable, "-m", "jupyter_gpubudget.service",
                    "--budgets=/etc/gpubudget/budgets.yaml",      # ADAPT: your account tree
                    # no GPU driver on this host? declare the hardware instead:
                    "--inventory=/etc/gpubudget/inventory.yaml",
                    "--db=postgresql://gpubudget@db.example.org/gpubudget",
                    # jobs run as their users (hub user name = Unix account name here; else
                    # --LocalBackend.unix_user_template=...)
                    "--LocalBackend.launcher_config=/etc/gpubudget/launcher.json"],
    },
    # the token BudgetSpawner (inside the hub) uses to queue sessions on users' behalf
    {"name": "gpubudget-spawner", "api_token": SPAWNER_TOKEN},
]
c.JupyterHub.load_roles = [
    # every user may read their budgets and start sessions; membership of projects (who may
    # charge what) comes from the budgets file, not from here
    {"name": "user", "scopes": ["self", "custom:gpubudget:submit", "custom:gpubudget:manage",
                                "access:services!service=gpubudget"]},
    {"name": "gpubudget-admin", "users": ["root"],               # ADAPT: budget admins
     "scopes": ["custom:gpubudget:admin", "access:services!service=gpubudget"]},
    {"name": "gpubudget-spawner", "services": ["gpubudget-spawner"],
     "scopes": ["custom:gpubudget:admin"]},
    {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                  "custom:gpubudget:read", "access:services!service=gpubudget"]},
]

# ---------------------------------------------------------------- BudgetSpawner
c.JupyterHub.spawner_class = "gpubudget"     # entry point of jupyter_gpubudget.hub.BudgetSpawner
# What runs the server once a slice is granted. Local processes as the real Unix user:
c.BudgetSpawner.backend_spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.BudgetSpawner.service_api_url = "http://127.0.0.1:10101/services/gpubudget/api/v1"
c.BudgetSpawner.service_token = SPAWNER_TOKEN
c.BudgetSpawner.max_queue_wait = 4 * 3600      # then the request is withdrawn, with a message
c.BudgetSpawner.default_min_runtime = "2h"     # protected time unless the user asks otherwise
c.BudgetSpawner.idle_limit = 2 * 3600          # idle (GPU util via NVML, else kernel activity)
c.BudgetSpawner.gpu_idle_utilisation = 5.0     # ... at or below this GPU utilisation, percent
c.BudgetSpawner.heartbeat_interval = 30        # charge checkpoints; preemption reaction time
# the spawn form's live quote and the queue page (place in the queue, "Leave queue")
from jupyter_gpubudget.hub.form import TEMPLATES as GPUBUDGET_TEMPLATES  # noqa: E402
from jupyter_gpubudget.hub.handlers import register_handlers  # noqa: E402

register_handlers()  # (c.JupyterHub.extra_handlers works too, with a deprecation warning)
c.JupyterHub.template_paths = [str(GPUBUDGET_TEMPLATES)]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120

# Cull servers idle for long (each cull ends the session's charge):
#   pip install jupyterhub-idle-culler, then add to c.JupyterHub.services:
#   {"name": "idle-culler", "command": [sys.executable, "-m", "jupyterhub_idle_culler",
#                                       "--timeout=14400"]}
#   and a role with scopes list:users, read:users:activity, read:servers, delete:servers.
