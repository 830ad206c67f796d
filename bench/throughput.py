"""Population-evaluation throughput (docs/architecture.md, "Benchmarks"). Every figure is a ratio measured in this
one run on this machine.

    python bench/throughput.py [--population 16] [--prompts 32] [--tokens 16]

  evora         EngineWorker.evaluate: materialise N adapters from seeds, one multi-LoRA
                vLLM generate over N x P prompts, rewards
  seeds' way    one adapter at a time through transformers generate (PEFT), prompts batched
  base limit    the same vLLM engine generating the same tokens with the base model only
  overhead      share of a real `evora` generation (1 worker) spent outside generate

A ~26M-parameter Llama with random weights (the tiny model's tokenizer) stands in for a
real model; every sequence generates exactly --tokens tokens (ignore_eos).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ray  # noqa: F401  (EngineWorker.info imports it lazily; fail early if missing)
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def build_bench_model(folder: Path) -> int:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "evora" / "models" / "tiny")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def overrides(model: Path, args: argparse.Namespace) -> list[str]:
    return [
        f"model.path={model}",
        "model.dtype=float32",
        "model.max_model_len=256",
        f"lora.rank={args.rank}",
        "lora.alpha=16",
        "lora.layers=null",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        f"strategy.population={args.population}",
        "strategy.sigma=0.01",
        "strategy.init_b_std=0.01",
        f"engine.max_loras={args.population}",
        "engine.ignore_eos=true",
        f"task.prompts_per_generation={args.prompts}",
        f"task.max_tokens={args.tokens}",
        "hardware.num_workers=1",
        f"hardware.cpu_threads_per_worker={args.threads}",
    ]


def timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def measure_in_process(model: Path, args: argparse.Namespace) -> dict:
    from evora.config.compose import compose_run
    from evora.distributed.worker import EngineWorker, WorkUnit, worker_spec
    from evora.engines import EngineSpec, create_engine
    from evora.lora.init import random_adapter
    from evora.lora.layout import build_layout, linear_shapes_of_model
    from evora.strategies.protocol import materialise

    run = compose_run(overrides(model, args))
    layout = build_layout(
        linear_shapes_of_model(str(model)),
        rank=run.lora.rank,
        alpha=run.lora.alpha,
        target_modules=run.lora.target_modules,
        layers=None,
        base_model=str(model),
    )
    worker = EngineWorker(worker_spec(run, str(model), layout, "bench"), 0)
    state = worker.strategy.start(random_adapter(layout, 0, None, 0.01))
    prompts = tuple(range(args.prompts))
    generation = iter(range(10**6))

    def evora_population():
        specs, payload = worker.strategy.ask(state, next(generation))
        return worker.evaluate(payload, WorkUnit(tuple(specs), "train", prompts))

    worker.engine.generate([worker.prompt_ids("train", 0)], [None], 2)  # warm-up
    evora_seconds, result = timed(evora_population, args.repeats)
    tokens = int(result.tokens.sum())

    texts = [worker.prompt_ids("train", i) for i in prompts]
    n = args.population

    def base_only():
        return worker.engine.generate(texts * n, [None] * (len(texts) * n), args.tokens)

    base_seconds, out = timed(base_only, args.repeats)
    assert sum(c.num_tokens for c in out) == tokens

    # The seeds' way: transformers + PEFT, one adapter at a time, its prompts batched.
    hf = create_engine(
        "hf",
        EngineSpec(
            model=str(model), dtype="float32", max_num_seqs=args.prompts, cpu_threads=args.threads, ignore_eos=True
        ),
    )
    specs, payload = worker.strategy.ask(state, 0)

    def seeds_way():
        total = 0
        for spec in specs:
            ref = worker.scratch.write(spec.label, materialise(worker.strategy, payload, spec), layout, torch.float32)
            total += sum(c.num_tokens for c in hf.generate(texts, [ref] * len(texts), args.tokens))
            hf.release([ref])
            worker.scratch.remove([ref])
        return total

    seeds_seconds, seeds_tokens = timed(seeds_way, max(1, args.repeats - 1))
    assert seeds_tokens == tokens
    worker.shutdown()
    return {
        "tokens_per_population": tokens,
        "evora_seconds": evora_seconds,
        "base_only_seconds": base_seconds,
        "seeds_way_seconds": seeds_seconds,
        "evora_timings": result.timings,
    }


def measure_overhead(model: Path, args: argparse.Namespace) -> dict:
    """A real run through the CLI (Ray, driver actor, object store, checkpoints)."""
    out = Path(tempfile.mkdtemp(prefix="evora-bench-"))
    cmd = [
        sys.executable,
        "-m",
        "evora",
        *overrides(model, args),
        f"generations={args.generations}",
        "eval_every=0",
        "task.eval_size=8",
        f"tracking.out_dir={out}",
        "tracking.progress=false",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    run_dir = next(out.iterdir())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # A generation is the wall-clock time between consecutive records (dispatch, evaluation,
    # update, metrics, checkpoint: everything). Skip the first (warm-up) and the last (held-out eval).
    spans = [
        (b["time"] - a["time"], b["seconds_generate"])
        for a, b in zip(records[1:], records[2:])
        if "heldout_reward" not in b
    ]
    shutil.rmtree(out)
    return {
        "overhead_share": statistics.median(1 - generate / span for span, generate in spans),
        "generation_seconds": statistics.median(span for span, _ in spans),
        "generations_measured": len(spans),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--out", default=str(RESULTS / "throughput.json"))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="evora-bench-model-"))
    parameters = build_bench_model(folder)
    measured = measure_in_process(folder, args)
    measured.update(measure_overhead(folder, args))
    shutil.rmtree(folder)
    tokens = measured["tokens_per_population"]
    report = {
        "setup": {**vars(args), "model_parameters": parameters, "device": "cpu", "torch_threads": args.threads},
        "measured": measured,
        "tokens_per_second": {
            name: tokens / measured[f"{name}_seconds"] for name in ("evora", "seeds_way", "base_only")
        },
        "ratios": {
            "evora_vs_seeds_way": measured["seeds_way_seconds"] / measured["evora_seconds"],
            "evora_vs_base_only_limit": measured["base_only_seconds"] / measured["evora_seconds"],
            "overhead_share_of_generation": measured["overhead_share"],
        },
        "targets": {
            "evora_vs_seeds_way": ">= 5",
            "evora_vs_base_only_limit": ">= 0.6",
            "overhead_share_of_generation": "<= 0.10",
        },
    }
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    s, tps, ratios = report["setup"], report["tokens_per_second"], report["ratios"]
    table = Table(
        title=f"population evaluation: {s['population']} adapters x {s['prompts']} prompts x "
        f"{s['tokens']} tokens, {s['model_parameters'] / 1e6:.1f}M-parameter model, rank {s['rank']}"
    )
    table.add_column("path")
    table.add_column("tokens/s", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    table.add_row("evora (multi-LoRA vLLM)", f"{tps['evora']:,.0f}", "1.00", "")
    table.add_row(
        "seeds' way (transformers, one adapter at a time)",
        f"{tps['seeds_way']:,.0f}",
        f"evora {ratios['evora_vs_seeds_way']:.2f}x",
        ">= 5x",
    )
    table.add_row(
        "base-model-only limit (same vLLM engine)",
        f"{tps['base_only']:,.0f}",
        f"evora at {ratios['evora_vs_base_only_limit']:.2f} of it",
        ">= 0.6",
    )
    table.add_row(
        "share of a generation outside generate", "", f"{ratios['overhead_share_of_generation']:.1%}", "<= 10%"
    )
    Console().print(table)


if __name__ == "__main__":
    main()
