"""fleet.yaml ``engine_args`` as vLLM's command line, and their check by vLLM's own parser.

``engine_argv`` turns a mapping into flags: ``{"max_model_len": 512, "enforce_eager":
True}`` becomes ``--max-model-len 512 --enforce-eager``. Values pass through unchanged;
vLLM judges them. ``check_engine_args(fleet)`` runs what every model would start with
(``FleetConfig.engine_args_for``: the user's arguments plus the derived ones) through
vLLM's server argument parser before anything starts, and raises ``ConfigError`` naming
the model and the argument. It imports vLLM (seconds), so ``rayfleet up`` calls it once,
just before it starts Ray; ``rayfleet up --dry-run`` stops after it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
from collections.abc import Mapping
from typing import Any

from rayfleet.config import FleetConfig, did_you_mean
from rayfleet.errors import ConfigError


def engine_argv(engine_args: Mapping[str, Any]) -> list[str]:
    """fleet.yaml ``engine_args`` as vLLM command-line flags, in order."""
    argv: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def check_engine_args(fleet: FleetConfig) -> None:
    """Run every model's engine arguments (derived ones included) through vLLM's parser.

    Raises ConfigError naming the model and the argument. Imports vLLM (seconds).
    """
    parser = vllm_server_parser()
    known = sorted({a.dest for a in parser._actions if a.dest != "help"})
    for index, model in enumerate(fleet.models):
        if model.engine == "sim":
            continue  # a simulated engine takes no vLLM arguments
        engine_args = fleet.engine_args_for(model)
        for key in engine_args:
            if key not in known:
                hint = did_you_mean(key, known)
                raise ConfigError(
                    f"models[{index}].engine_args.{key}: not a vLLM server argument{hint}"
                )
        argv = ["--model", model.source, *engine_argv(engine_args)]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(argv)
            except SystemExit:
                reason = err.getvalue().strip().splitlines()[-1] if err.getvalue() else "rejected"
                reason = reason.split("error: ", 1)[-1]
                raise ConfigError(
                    f"models[{index}].engine_args ({model.name}): vLLM rejects them: {reason}"
                ) from None


def vllm_server_parser() -> argparse.ArgumentParser:
    """vLLM's OpenAI server argument parser, wherever the release keeps it."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        cli_args = importlib.import_module("vllm.entrypoints.launchers.cli_args")
    except ImportError:  # older vLLM releases
        cli_args = importlib.import_module("vllm.entrypoints.openai.cli_args")
    parser: argparse.ArgumentParser = cli_args.make_arg_parser(
        FlexibleArgumentParser(prog="vllm-server")  # type: ignore[no-untyped-call]
    )
    return parser
