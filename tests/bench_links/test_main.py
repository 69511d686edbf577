"""`raypd bench links`'s command line (benchmarks/links/main.py): sizes, the write plan its flags make,
the flags it refuses before touching a cluster, and its place in `raypd bench`."""
from __future__ import annotations

import argparse
import importlib

import pytest

from raypd.benchmarks.links.main import build_parser, main, options_from, size
from raypd.cluster.cli.bench import BENCHMARKS


def test_sizes_are_bytes_or_binary_units():
    assert [size("4096"), size("4KiB"), size("1.5MiB"), size("1GiB")] == [4096, 4096, 3 << 19, 1 << 30]
    for bad in ("3x", "1MB", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            size(bad)


def test_the_defaults_make_a_pool_of_32_mib_in_4_kib_blocks():
    options = options_from(build_parser().parse_args([]))
    assert (options.spec.backend, options.spec.block_bytes, options.spec.num_blocks) == ("nixl", 4096, 8192)
    assert options.plan.block_counts() == [1] * 8 + [8192] * 5
    assert (options.same_host, options.one_way, options.spec.timeout_s) == (True, False, 60.0)


@pytest.mark.parametrize("flags", [["--bytes", "4KiB"], ["--bytes", "8GiB"], ["--reps", "0"], ["--min-gap", "1"]])
def test_bad_flags_exit_2_before_any_cluster(flags, capsys):
    assert main(flags) == 2
    assert "raypd bench links:" in capsys.readouterr().err


def test_it_is_a_raypd_bench():
    assert importlib.import_module(BENCHMARKS["links"]).main is main
