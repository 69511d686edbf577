"""The `raypd` command line."""
from __future__ import annotations

import argparse
import sys

from raypd.cluster.cli.bench import add_bench_parser
from raypd.cluster.cli.generate import add_generate_parser
from raypd.cluster.cli.serve import add_serve_parser
from raypd.cluster.cli.status import add_status_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raypd", description="Ray-based LLM serving with prefill/decode disaggregation")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_status_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
