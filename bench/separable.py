"""SNES and PGPE at a real LoRA's size (issue 42): their driver-side update (every member's noise
drawn again, two sums) against ES's update summed in one place, and a candidate's materialise,
on random tensors of Qwen2.5-1.5B's widths.

    PYTHONPATH=. python bench/separable.py [--layers 28] [--rank 8] [--population 30] [--out FILE]
    python bench/separable.py --smoke       (CI: two layers, rank 2)

The adapter is rank r on all seven linear modules of --layers layers (28: the whole model,
9.2M values at rank 8). Times are the median of --repeats; the ratios are what to read: the
separable strategies' tell against ES's (ES sums on the workers in a run, so its driver's part is
smaller still: bench/real_shapes.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # evora and the bench helpers from this checkout


from bench_model import median_seconds  # noqa: E402
from eggroll_update import layer_shapes  # noqa: E402

from evora.lora.layout import build_layout  # noqa: E402
from evora.strategies.es import ESConfig, EvolutionStrategy  # noqa: E402
from evora.strategies.pgpe import PGPE, PGPEConfig  # noqa: E402
from evora.strategies.protocol import fitness_results  # noqa: E402
from evora.strategies.separable import SeparableState  # noqa: E402
from evora.strategies.snes import SNES, SNESConfig  # noqa: E402


def adapter(layers: int, rank: int) -> dict[str, torch.Tensor]:
    modules = layer_shapes("qwen2.5-1.5b")
    shapes = {f"model.layers.{i}.{m}": s for i in range(layers) for m, s in modules.items()}
    targets = [m.split(".")[1] for m in modules]
    layout = build_layout(shapes, rank=rank, alpha=rank, target_modules=targets, layers=None, base_model="b")
    return {k: torch.randn(s) * 0.01 for k, s in layout.shapes().items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    mu = adapter(args.layers, args.rank)
    fitness = fitness_results(0, np.random.default_rng(0).normal(size=args.population))
    es = EvolutionStrategy(ESConfig(population=args.population), run_seed=0)
    es_state = es.start(mu)
    state = SeparableState(mu, {k: torch.full_like(v, 0.001) for k, v in mu.items()})
    pgpe_state = SeparableState(mu, state.sigma, velocity={k: torch.zeros_like(v) for k, v in mu.items()})
    strategies = {"es": (es, es_state), "snes": (SNES(SNESConfig(population=args.population), 0), state)}
    strategies["pgpe"] = (PGPE(PGPEConfig(population=args.population), 0), pgpe_state)
    results: dict[str, Any] = {"values": sum(v.numel() for v in mu.values()), "threads": torch.get_num_threads()}
    for name, (strategy, start) in strategies.items():
        specs, payload = strategy.ask(start, 0)
        tell = median_seconds(lambda: strategy.tell(start, specs, fitness), args.repeats, warm=1)
        one = median_seconds(lambda: strategy.materialise(payload, specs[1]), args.repeats, warm=1)
        results[name] = {"tell_s": tell, "materialise_s": one}
    for name in ("snes", "pgpe"):
        results[name]["tell_vs_es"] = results[name]["tell_s"] / results["es"]["tell_s"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--population", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "separable.json")
    args = parser.parse_args()
    if args.smoke:
        args.layers, args.rank, args.population, args.repeats = 2, 2, 8, 1
    results = measure(args)
    print(
        f"{results['values']:,} LoRA values (Qwen2.5-1.5B, {args.layers} layers, rank {args.rank}), N={args.population}"
    )
    for name in ("es", "snes", "pgpe"):
        r = results[name]
        ratio = f"  {r['tell_vs_es']:.2f}x ES's" if "tell_vs_es" in r else ""
        print(f"{name:5} tell {r['tell_s']:8.3f} s{ratio}   materialise {r['materialise_s']:.4f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
