"""The KV transfer flags of `raypd serve` and `raypd generate`, and the node actors' transfer options
(kvtransfer TransferConfig fields) they make."""
from __future__ import annotations

import argparse

# kvtransfer/nixl/params.py NIXL_BACKENDS; written out so that parsing flags imports no torch.
NIXL_BACKENDS = ("UCX", "LIBFABRIC")


def add_transfer_args(group: argparse._ActionsContainer) -> None:
    group.add_argument("--transfer-backend", choices=["nixl", "tcp"], default="nixl")
    group.add_argument("--nixl-backend", choices=NIXL_BACKENDS, default="UCX",
                       help="NIXL's transport: UCX (InfiniBand/RoCE, NVLink, CMA; default) or LIBFABRIC (AWS EFA; "
                            "needs libfabric on the hosts)")
    group.add_argument("--nixl-devices", default="", metavar="SPEC",
                       help="UCX only: the RDMA devices per GPU, e.g. mlx5_0 for every node, or "
                            "0=mlx5_0,1=mlx5_1,*=mlx5_2 by the machine's GPU index (* = other GPUs and CPU nodes; "
                            "+ joins several devices); default: every device UCX finds")


def transfer_options(args: argparse.Namespace) -> dict:
    options = {"backend": args.transfer_backend, "nixl_backend": args.nixl_backend}
    if args.nixl_devices:
        options["nixl_devices"] = args.nixl_devices
    return options
