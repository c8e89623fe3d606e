"""A DRA notebook pod with the real KubeSpawner against the fake API server (not a Kubernetes
cluster): the pod references a ResourceClaim that the configurer's after_pod_created_hook
creates, owned by the pod; the fake scheduler binds a pod only once its claims exist; the
garbage collector deletes the claim with the pod. (CEL selectors are not evaluated by the fake
API server; the claim's content is checked as written.)"""

from __future__ import annotations

import asyncio
import sys

from jupyter_gpubudget.backends import k8s_objects as ko
from tests.kubernetes.conftest import gpu_node, need


async def test_dra_notebook_claim_created_owned_and_collected(api, kubecfg, monkeypatch):
    need("kubespawner")
    import kubernetes_asyncio.config.kube_config as kc
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    from jupyter_gpubudget.backends.kubernetes import configure_kubespawner

    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubecfg))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    gpu_node(api, "h1", 0, mig={"1g.10gb": 7}, mig_gpus=1)
    c = Config()
    c.KubePlacement.mode = "dra"
    c.KubePlacement.stop_grace = 2
    c.KubeSpawner.cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    c.KubeSpawner.k8s_api_host = api.url  # a fresh client configuration for this server
    c.KubeSpawner.events_enabled = False
    c.KubeSpawner.start_timeout = 30
    KubeSpawner.reflectors.clear()
    sp = KubeSpawner(config=c, _mock=True)
    sp.api_token = "t"
    placement = [{"node": "h1", "gpu": 0, "kind": "mig", "profile": "1g.10gb",
                  "mig_start": 6, "milli": 143}]
    configure_kubespawner(sp, placement, {"env": {}, "session": "dra-1", "project": "astro",
                                          "user": "mock@name", "kind": "interactive"})
    try:
        url = await asyncio.wait_for(sp.start(), 60)
        pod = api.get("pods", sp.pod_name)
        assert url.startswith("http://127.") and pod["status"]["phase"] == "Running"
        claim = api.get("resourceclaims", f"{sp.pod_name}-gpu")
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        req = claim["spec"]["devices"]["requests"][0]["exactly"]
        assert req["deviceClassName"] == "mig.nvidia.com"
        assert "profile == '1g.10gb'" in req["selectors"][0]["cel"]["expression"]
        assert claim["status"]["reservedFor"][0]["name"] == sp.pod_name
        assert pod["spec"]["resourceClaims"] == [{"name": "gpu",
                                                  "resourceClaimName": f"{sp.pod_name}-gpu"}]
        assert any(w == "started" for _, p, w in api.kubelet_log if p == sp.pod_name)
        sent = {**pod, "spec": {k: v for k, v in pod["spec"].items() if k != "nodeName"}}
        assert ko.check_manifest(sent) == []  # nodeName: set by the scheduler, not by us
        await asyncio.wait_for(sp.stop(), 30)
        assert api.get("pods", sp.pod_name) is None
        assert api.get("resourceclaims", f"{sp.pod_name}-gpu") is None  # collected with it
    finally:
        for r in list(KubeSpawner.reflectors.values()):
            await r.stop()
        KubeSpawner.reflectors.clear()
