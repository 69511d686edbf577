"""Values scenarios for rendering the chart, and small readers of the rendered objects."""
from __future__ import annotations

# A production-like install: every knob away from its default.
BIG = {
    "fullnameOverride": "llm-prod",
    "image": {"repository": "registry.example.com/raypd", "tag": "1.2.3"},
    "gpusPerNode": 1,
    "serve": {"policy": "cache_aware", "extraArgs": {"served_model_name": "qwen", "ingress_replicas": 2, "policy": "round_robin"}},
    "apiKey": {"value": "sk-test-123"},
    "model": {
        "path": "/models/qwen",
        "volume": {"type": "existingClaim", "existingClaim": "weights"},
        "download": {"enabled": True, "command": ["sh", "-c", "test -d /models/qwen || echo fetch"]},
    },
    "workerGroups": {
        "prefill": {"replicas": 3, "minReplicas": 2, "maxReplicas": 4,
                    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
                    "rayLabels": {"raypd.io/tor": "tor-1", "raypd.io/spine": "spine-0"}},
        "prefill-r2": {"enabled": True, "role": "prefill", "replicas": 1,
                       "nodeSelector": {"example.com/rack": "r2"}, "rayLabels": {"raypd.io/tor": "tor-2"}},
        "decode": {"replicas": 2},
    },
    "probes": {"liveness": {"enabled": True}},
    "service": {"type": "LoadBalancer",
                "annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}},
    "rayService": {"upgradeStrategy": "None"},
    "metrics": {"podMonitor": {"enabled": True}},
    "topology": {"config": "switches:\n  - {name: tor-1, kind: tor}\n"},
}
MIXED = {"workerGroups": {"prefill": {"enabled": False}, "decode": {"enabled": False},
                          "mixed": {"enabled": True, "replicas": 2}}}
CPU = {"gpusPerNode": 0}
HOSTPATH = {"model": {"path": "/models/m", "volume": {"type": "hostPath", "hostPath": {"path": "/mnt/models"}}}}
PVC = {"model": {"volume": {"type": "persistentVolumeClaim",
                            "persistentVolumeClaim": {"size": "200Gi", "storageClassName": "efs"}}}}
EXISTING_SECRET = {"apiKey": {"existingSecret": "my-key", "secretKey": "token"}}
# Tenants' keys from a Secret of the user's (and no single key).
KEYS_FILE = {"apiKeysFile": {"existingSecret": "tenant-keys"}}
# InfiniBand/RoCE through the RDMA shared device plugin, on the hosts' network, a NIC per GPU.
RDMA = {
    "rdma": {"resources": {"rdma/rdma_shared_device_a": 1}, "ipcLock": True},
    "shm": {"sizeLimit": "16Gi"},
    "hostNetwork": True,
    "nixl": {"backend": "UCX", "devices": "0=mlx5_0,1=mlx5_1,*=mlx5_0"},
    "engine": {"dtype": "bfloat16", "gpuMemoryUtilization": 0.85, "kvCacheMemoryMb": 8192},
}
# AWS EFA: the EFA device plugin's interfaces, LIBFABRIC picking the rails per GPU itself.
EFA = {
    "rdma": {"resources": {"vpc.amazonaws.com/efa": 4}, "ipcLock": True},
    "shm": {"sizeLimit": "32Gi"},
    "nixl": {"backend": "LIBFABRIC"},
}
SCENARIOS = {"default": {}, "big": BIG, "keys-file": KEYS_FILE, "mixed": MIXED, "cpu": CPU, "hostpath": HOSTPATH, "pvc": PVC,
             "existing-secret": EXISTING_SECRET, "rdma": RDMA, "efa": EFA}


def containers(r) -> list[dict]:
    specs = [r.head["template"]["spec"]] + [g["template"]["spec"] for g in r.cluster["workerGroupSpecs"]]
    return [c for s in specs for c in s["containers"]]


def ports(container: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}
