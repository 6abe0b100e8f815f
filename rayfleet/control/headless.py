"""A headless rank of a vLLM engine that spans nodes: its workers, no API server.

    python -m rayfleet.control.headless --model M --tensor-parallel-size 2 \\
        --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500

A replica that spans ``nodes_per_replica`` nodes runs vLLM's OpenAI server (rank 0) on
its first node and one of these on each other node. vLLM starts such ranks with
``vllm serve --headless``, but the ``vllm`` command fails under the CPU build (it looks
up package metadata named ``vllm``), and ``python -m vllm.entrypoints.openai.api_server
--headless`` does not run headless (it starts an engine core that refuses to follow).
So this module parses the arguments with vLLM's own server parser and calls vLLM's
headless runner, wherever the release keeps them. It must run as ``__main__``: vLLM
spawns its worker processes, which re-import the main module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from rayfleet.control.engine_args import vllm_server_parser


def headless_runner() -> Callable[[argparse.Namespace], None]:
    """vLLM's ``run_headless(args)``: what ``vllm serve --headless`` calls."""
    module = importlib.import_module("vllm.entrypoints.cli.serve")
    runner: Callable[[argparse.Namespace], None] = module.run_headless
    return runner


def parse_headless_args(argv: Sequence[str]) -> argparse.Namespace:
    """vLLM's server arguments, set up as ``vllm serve --headless`` sets them."""
    args = vllm_server_parser().parse_args([*argv, "--headless"])
    if getattr(args, "api_server_count", None) is None:
        args.api_server_count = 0  # headless: no API servers
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_headless_args(sys.argv[1:] if argv is None else argv)
    headless_runner()(args)


if __name__ == "__main__":
    main()
