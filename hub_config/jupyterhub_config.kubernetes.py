# jupyterhub_config.kubernetes.py — the gpubudget hub with notebooks as Kubernetes pods.
#
# The demo hub of jupyterhub_config.py (service managed by the hub, BudgetSpawner, budgets and
# declared inventory files), but BudgetSpawner wraps KubeSpawner: a granted placement becomes
# the pod's GPU resources, node pinning, labels and annotations
# (jupyter_gpubudget.backends.kubernetes:configure_kubespawner). For a hub running inside the
# cluster with Zero to JupyterHub use hub_config/z2jh/values.yaml instead; this file is for a
# hub outside the cluster (kubeconfig: $KUBECONFIG) and for the tests, which point it at an
# in-process fake API server.
#
# Extra knobs (environment), besides those of jupyterhub_config.py:
#   KUBECONFIG                   kubeconfig of the cluster (read by kubernetes-asyncio)
#   GPUBUDGET_K8S_NAMESPACE      namespace of the notebook pods                 [default]
#   GPUBUDGET_K8S_IMAGE          single-user image          [quay.io/jupyter/base-notebook]
#   GPUBUDGET_K8S_CMD            JSON list: the server command in the image
#                                                           [["jupyterhub-singleuser"]]
#   GPUBUDGET_HUB_CONNECT_IP     address the pods reach the hub's API on        [127.0.0.1]
#   GPUBUDGET_K8S_MODE           device-plugin or dra                           [device-plugin]
#   GPUBUDGET_K8S_MIG_STRATEGY   mixed or single                                [mixed]
#   GPUBUDGET_K8S_SNAPSHOT_CMD   JSON list: preStop command snapshotting a session   [none]
#   GPUBUDGET_K8S_STOP_GRACE     seconds a pod gets to snapshot and stop        [60]
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by JupyterHub
load_subconfig(str(Path(__file__).with_name("jupyterhub_config.py")))  # noqa: F821

env = os.environ.get

c.BudgetSpawner.backend_spawner_class = "kubespawner.KubeSpawner"
c.BudgetSpawner.child_configurer = "jupyter_gpubudget.backends.kubernetes:configure_kubespawner"
c.JupyterHub.hub_connect_ip = env("GPUBUDGET_HUB_CONNECT_IP", "127.0.0.1")

c.KubeSpawner.namespace = env("GPUBUDGET_K8S_NAMESPACE", "default")
c.KubeSpawner.image = env("GPUBUDGET_K8S_IMAGE", "quay.io/jupyter/base-notebook:latest")
c.KubeSpawner.cmd = json.loads(env("GPUBUDGET_K8S_CMD", '["jupyterhub-singleuser"]'))
c.KubeSpawner.args = []  # the local demo's --allow-root is not for pods
# the local demo's PATH (this machine's virtualenv) means nothing inside an image
c.KubeSpawner.environment = {}
c.KubeSpawner.start_timeout = 300
c.KubeSpawner.http_timeout = 120
c.KubeSpawner.delete_stopped_pods = True

c.KubePlacement.mode = env("GPUBUDGET_K8S_MODE", "device-plugin")
c.KubePlacement.mig_strategy = env("GPUBUDGET_K8S_MIG_STRATEGY", "mixed")
c.KubePlacement.snapshot_command = json.loads(env("GPUBUDGET_K8S_SNAPSHOT_CMD", "[]"))
c.KubePlacement.stop_grace = int(env("GPUBUDGET_K8S_STOP_GRACE", "60"))
