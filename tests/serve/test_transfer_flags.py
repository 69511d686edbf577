"""The KV transfer flags reach what a node actor builds: `raypd serve` and `raypd generate` turn
--transfer-backend / --nixl-backend / --nixl-devices into transfer options, ServeConfig refuses a bad
one before anything starts, and the ClusterSpec carries them to the node actors' TransferConfig."""
from __future__ import annotations

import pytest

from raypd.cluster.cli import transfer_args
from raypd.cluster.cli.main import build_parser
from raypd.cluster.cli.serve import config_from_args
from raypd.cluster.serve.config import ServeConfig, ServeConfigError
from raypd.kvtransfer import TransferConfig
from raypd.kvtransfer.nixl.params import NIXL_BACKENDS, NicMap


def serve_config(*argv: str) -> ServeConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults_keep_nixl_over_ucx_with_every_device():
    assert serve_config().transfer_options == {"backend": "nixl", "nixl_backend": "UCX"}


def test_serve_flags_reach_the_node_actors_transfer_config():
    spec = serve_config("--nixl-backend", "UCX", "--nixl-devices", "0=mlx5_0,1=mlx5_1+mlx5_3,*=mlx5_0").cluster_spec()
    assert spec.transfer_options == {"backend": "nixl", "nixl_backend": "UCX",
                                     "nixl_devices": "0=mlx5_0,1=mlx5_1+mlx5_3,*=mlx5_0"}
    # What node_core.transfer_config makes of them on a node (its own IP first, the options over it).
    cfg = TransferConfig(**{"host": "10.0.0.5", **spec.transfer_options})
    assert NicMap.parse(cfg.nixl_devices).devices_for(1) == ("mlx5_1", "mlx5_3")
    libfabric = serve_config("--nixl-backend", "LIBFABRIC").cluster_spec().transfer_options
    assert TransferConfig(**libfabric).nixl_backend == "LIBFABRIC"


def test_app_args_carry_the_same_options():
    """A Serve config file (the Helm chart) sets them as transfer_options."""
    cfg = ServeConfig.from_args({"transfer_options": {"nixl_backend": "LIBFABRIC"}})
    assert cfg.cluster_spec().transfer_options == {"nixl_backend": "LIBFABRIC"}


@pytest.mark.parametrize("argv,message", [
    (("--nixl-devices", "mlx5_0:2"), "transfer options: nixl_devices 'mlx5_0:2'"),
    (("--nixl-devices", "0=mlx5_0,mlx5_1"), "mixes GPU=DEVICE entries"),
    (("--nixl-backend", "LIBFABRIC", "--nixl-devices", "rdmap16s27"), "applies to UCX only"),
], ids=["port", "mixed", "libfabric-devices"])
def test_bad_transfer_options_fail_before_anything_starts(argv, message):
    with pytest.raises(ServeConfigError, match=message):
        serve_config(*argv)


def test_unknown_transfer_option_in_app_args_is_refused():
    with pytest.raises(ServeConfigError, match="transfer options: .*nixl_ucx_devices"):
        ServeConfig.from_args({"transfer_options": {"nixl_ucx_devices": "mlx5_0"}})


def test_nixl_backend_flag_takes_only_the_known_plugins(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--nixl-backend", "ucx"])
    assert "invalid choice: 'ucx'" in capsys.readouterr().err
    assert transfer_args.NIXL_BACKENDS == NIXL_BACKENDS   # the flag's list is kvtransfer's


def test_generate_flags_reach_the_cluster_spec():
    from raypd.cluster.cli.generate_cluster import spec_from_args

    args = build_parser().parse_args(["generate", "--mode", "pd", "--transfer-backend", "tcp",
                                      "--nixl-backend", "LIBFABRIC", "hi"])
    assert spec_from_args(args).transfer_options == {"backend": "tcp", "nixl_backend": "LIBFABRIC"}
    args = build_parser().parse_args(["generate", "--mode", "pd", "--nixl-devices", "mlx5_0", "hi"])
    assert spec_from_args(args).transfer_options["nixl_devices"] == "mlx5_0"
