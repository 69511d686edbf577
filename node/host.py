"""Where an actor runs, so placement and the Conductor's topology can use it."""
from __future__ import annotations

import os
import socket

from raypd.protocol.messages import HostInfo


def host_info() -> HostInfo:
    try:
        import ray
        if ray.is_initialized():
            return HostInfo(node_id=ray.get_runtime_context().get_node_id(), ip=ray.util.get_node_ip_address(),
                            hostname=socket.gethostname(), pid=os.getpid())
    except ImportError:
        pass
    return HostInfo(node_id="", ip="127.0.0.1", hostname=socket.gethostname(), pid=os.getpid())
