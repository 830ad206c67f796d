"""One EGGROLL generation against the ES paper's way, on the same vLLM engine
(docs/architecture.md, "Benchmarks"). Every figure is a ratio measured in this one run.

    python bench/eggroll.py [--population 30] [--prompts 32] [--tokens 16] [--device cpu|cuda] [--model PATH]
    python bench/eggroll.py --smoke [--out FILE]

  evora         strategy=eggroll: N rank-r LoRAs rebuilt from seeds, one multi-LoRA generate
                over N x P prompts; then the update, applied to the fp32 master copies and
                re-cast into the engine (what every worker does after each generation)
  paper's way   member after member: add dense Gaussian noise to the same matrices in place,
                generate the P prompts with the base model, restore (Qiu et al. 2025's
                accelerated loop), through the same engine's base-weight hook
  update share  the update's part of an evora generation
  base limit    the same engine generating the same N x P sequences with no LoRA at all: what
                batching alone gives on this device (on a CPU, little: a batch of P is already
                compute-bound, where a GPU decodes N x P sequences for about the cost of P)

Without --model, the bench model of bench/throughput.py (a ~26M-parameter Llama with random
weights) stands in for a real model; every sequence generates exactly --tokens tokens
(ignore_eos). On a GPU machine (vLLM's GPU build): --device cuda [--model <folder or hub id>].
Results: bench/results/eggroll.json.

--smoke (CI: tests/integration/test_benches.py) runs every path at the least size: 2 candidates
x 2 prompts x 2 tokens, one repeat. Its figures mean nothing; it writes to --out, by default a
file in a new temporary folder, never over bench/results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import RESULTS, build_bench_model, median_seconds  # noqa: E402  (the same bench model)

from evora.models.parameters import count_parameters  # noqa: E402

SMOKE = {"population": 2, "prompts": 2, "tokens": 2, "repeats": 1}  # --smoke: every path at the least size
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def measure(model: Path, args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from evora.engines import create_engine
    from evora.engines.adapter_store import AdapterScratch
    from evora.engines.environment import vllm_environment
    from evora.engines.vllm_spec import VLLMSpec
    from evora.lora.base_weights import read_weights
    from evora.lora.layout import build_layout
    from evora.lora.modules import adaptable_modules
    from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
    from evora.strategies.full_weights import matrix_name
    from evora.strategies.protocol import StrategyContext, fitness_results

    torch.set_num_threads(args.threads)
    layout = build_layout(
        adaptable_modules(str(model)),
        rank=args.rank,
        alpha=args.rank,
        target_modules=TARGETS,
        layers=None,
        base_model=str(model),
    )
    names = [matrix_name(slot.name) for slot in layout.modules]
    spec = VLLMSpec(
        model=str(model),
        dtype=args.dtype,
        device=args.device,
        gpu_memory_utilization=0.5,
        max_model_len=256,
        max_lora_rank=max(8, args.rank),
        max_loras=args.population,
        max_cpu_loras=args.population,
        cpu_threads=args.threads,
        ignore_eos=True,
    )
    os.environ.update(vllm_environment(spec))  # what Ray gives worker actors
    engine = create_engine("vllm", spec)
    scratch = AdapterScratch("/dev/shm", "bench-eggroll")
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer(f"{a}+{b}=").input_ids for a, b in zip(range(10, 99, 3), range(50, 10, -1))][: args.prompts]
    eggroll = EggrollStrategy(EggrollConfig(population=args.population, rank=args.rank, sigma=0.01, lr=1e-4), 0)
    state = eggroll.initial_state(StrategyContext(0, layout, str(model)))
    master = eggroll.start_master(read_weights(str(model), names))
    engine.generate(prompts[:1], [None], 2)  # warm-up
    generations = iter(range(10**6))
    split: dict[str, list[float]] = {"evaluate": [], "update": []}

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    keep = scratch.hold if engine.loads_from_memory else scratch.write  # what EngineWorker.evaluate does

    def eggroll_generation() -> int:
        nonlocal state
        generation = next(generations)
        started = time.perf_counter()
        specs, payload = eggroll.ask(state, generation)
        refs = [keep(s.label, eggroll.materialise(payload, s), layout, dtype) for s in specs]
        out = engine.generate(prompts * len(refs), [r for r in refs for _ in prompts], args.tokens)
        engine.release(refs)
        scratch.remove(refs)
        evaluated = time.perf_counter()
        fitness = np.random.default_rng(generation).normal(size=len(specs))  # the update's cost does not depend on it
        state = eggroll.tell(state, specs, fitness_results(generation, fitness)).state
        eggroll.apply(master, eggroll.update_of(state, generation))
        engine.set_base_weights(master.tensors)
        split["evaluate"].append(evaluated - started)
        split["update"].append(time.perf_counter() - evaluated)
        return sum(c.num_tokens for c in out)

    def papers_way() -> int:
        """Perturb in place with seeded dense noise, generate, restore; member after member."""
        total = 0
        for member in range(args.population):
            generator = torch.Generator().manual_seed(member)
            noisy = {n: w + 0.01 * torch.randn(w.shape, generator=generator) for n, w in master.tensors.items()}
            engine.set_base_weights(noisy)
            total += sum(c.num_tokens for c in engine.generate(prompts, [None] * len(prompts), args.tokens))
            engine.set_base_weights(master.tensors)
        return total

    def base_limit() -> int:
        out = engine.generate(prompts * args.population, [None] * (len(prompts) * args.population), args.tokens)
        return sum(c.num_tokens for c in out)

    tokens = eggroll_generation()
    assert tokens == papers_way() == base_limit() == args.population * len(prompts) * args.tokens  # same work
    split = {"evaluate": [], "update": []}
    eggroll_seconds = median_seconds(eggroll_generation, args.repeats)
    papers_seconds = median_seconds(papers_way, max(1, args.repeats - 1))
    base_seconds = median_seconds(base_limit, args.repeats)
    update_share = statistics.median(u / (e + u) for e, u in zip(split["evaluate"], split["update"]))
    scratch.cleanup()
    engine.shutdown()
    return {
        "tokens_per_generation": tokens,
        "weights_moved": sum(slot.out_features * slot.in_features for slot in layout.modules),
        "eggroll_seconds": eggroll_seconds,
        "papers_way_seconds": papers_seconds,
        "base_limit_seconds": base_seconds,
        "update_seconds": statistics.median(split["update"]),
        "update_share": update_share,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--population", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", help="a local model folder (default: the ~26M random-weight bench model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: float32 on cpu, bfloat16 on cuda")
    parser.add_argument(
        "--out", help="the results file (default: bench/results/eggroll.json; --smoke: in a temporary folder)"
    )
    parser.add_argument("--smoke", action="store_true", help="every path at the least size (CI)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS
        args.out = str(folder / "eggroll.json")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.model is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-model-"))
        parameters = build_bench_model(folder)
        measured = measure(folder, args)
        shutil.rmtree(folder)
    else:
        parameters, measured = count_parameters(args.model), measure(Path(args.model), args)
    report = {
        "setup": {**vars(args), "model_parameters": parameters, "torch_threads": args.threads},
        "measured": measured,
        "ratios": {
            "eggroll_vs_papers_way": measured["papers_way_seconds"] / measured["eggroll_seconds"],
            "base_limit_vs_papers_way": measured["papers_way_seconds"] / measured["base_limit_seconds"],
            "update_share_of_generation": measured["update_share"],
        },
        "targets": {"eggroll_vs_papers_way": ">= 5", "update_share_of_generation": "<= 0.10"},
    }
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    s, m, ratios = report["setup"], report["measured"], report["ratios"]
    table = Table(
        title=f"one generation: {s['population']} candidates x {s['prompts']} prompts x {s['tokens']} tokens, "
        f"{s['model_parameters'] / 1e6:.1f}M-parameter model, {m['weights_moved'] / 1e6:.1f}M weights moved, "
        f"rank {s['rank']}"
    )
    for column in ("path", "seconds", "ratio", "target"):
        table.add_column(column, justify="left" if column == "path" else "right")
    table.add_row("evora eggroll (multi-LoRA vLLM + update)", f"{m['eggroll_seconds']:.2f}", "1.00", "")
    table.add_row(
        "paper's way (perturb in place, member by member)",
        f"{m['papers_way_seconds']:.2f}",
        f"evora {ratios['eggroll_vs_papers_way']:.2f}x",
        ">= 5x",
    )
    table.add_row(
        "base limit (same sequences, no LoRA)",
        f"{m['base_limit_seconds']:.2f}",
        f"{ratios['base_limit_vs_papers_way']:.2f}x the paper's way",
        "",
    )
    table.add_row(
        "update (fp32 master + re-cast)",
        f"{m['update_seconds']:.2f}",
        f"{ratios['update_share_of_generation']:.1%} of a generation",
        "<= 10%",
    )
    Console().print(table)


if __name__ == "__main__":
    main()
