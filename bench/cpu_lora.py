"""The CPU multi-LoRA op against the plain matmuls it performs (docs/architecture.md,
"Benchmarks"). Every figure is a ratio measured in this one run on this machine.

    python bench/cpu_lora.py [--adapters 16] [--rank 8] [--threads 2] [--out FILE]
    python bench/cpu_lora.py --smoke [--out FILE]

For each LoRA layer of the bench model of bench/throughput.py (fused qkv, o, fused gate_up,
down; hidden 512, intermediate 1536, 4 key-value heads of 64) and three batch shapes:

  decode, uniform   every adapter's rows in one run of equal length (a population in step)
  decode, uneven    rows interleaved across adapters, groups of 1..2x the mean size
  prefill           long runs of unequal length (whole prompts)

one LoRA product y += (x A^T) B^T per row with its adapter's (A, B), by

  evora         `grouped_lora_linear` (evora/engines/vllm_cpu_lora.py): the rows' grouping
                (once per step) and the weights' arrangement (once per set of active adapters)
                are made outside the timed call, as vLLM amortises them over every layer
  its matmuls   the matmuls evora's op performs (batched over padded groups in decode, one
                pair per group in prefill), on inputs already gathered and without putting
                the products back: the target is evora within 1.5x of these
  per adapter   evora's previous op: one matmul per adapter per slice (rows found per call)
  vLLM          vLLM's own torch ops: a weight gathered for every row, then an einsum
  base layer    the layer's own matmul x W^T, for scale (and the LoRA's FLOPs against it)

Then the op's share at real widths: a decoder layer's four LoRA products in an uneven decode
step against the layer's four base matmuls, at the bench model's widths and at Qwen2.5-1.5B's
and -7B's (random tensors of those widths, bench/real_shapes.py's shapes; --width-repeats
timed repeats). LoRA's FLOPs fall with the width (rank 8 against a hidden size of 512, 1,536,
3,584) and so does the op's share of a step's matmuls, which is most of what multi-LoRA
generation costs over base-only on vLLM's CPU build (bench/throughput.py's op-share figure).

Results: bench/results/cpu_lora.json. --smoke (CI: tests/integration/test_benches.py) measures
every layer, batch shape and op with 2 adapters and one timed repeat, and the widths table at
the bench model's and Qwen2.5-0.5B's widths; its figures mean nothing, and it writes to --out,
by default a file in a new temporary folder, never over bench/results.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_model import median_seconds
from real_shapes import MODELS, Shape

from evora.engines import vllm_cpu_lora as grouped_ops

RESULTS = Path(__file__).resolve().parent / "results"
BENCH_MODEL = Shape(512, 8, 4, 64, 8, intermediate=1536)  # bench_model.py's Llama
WIDTHS = {"bench model": BENCH_MODEL, "Qwen2.5-1.5B": MODELS["qwen2.5-1.5b"], "Qwen2.5-7B": MODELS["qwen2.5-7b"]}
SMOKE_WIDTHS = {"bench model": BENCH_MODEL, "Qwen2.5-0.5B": Shape(896, 14, 2, 64, 24, intermediate=4864)}
# --smoke: every layer, shape and op, at the least size
SMOKE = {"adapters": 2, "repeats": 1, "width_repeats": 1}


def layers_of(shape: Shape) -> dict[str, tuple[int, tuple[int, ...]]]:
    """A decoder layer's LoRA layers as vLLM fuses them: (input width, output slices)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {
        "qkv": (shape.hidden, (q, kv, kv)),
        "o": (q, (shape.hidden,)),
        "gate_up": (shape.hidden, (shape.intermediate, shape.intermediate)),
        "down": (shape.intermediate, (shape.hidden,)),
    }


LAYERS = layers_of(BENCH_MODEL)


def batch_indices(shape: str, adapters: int, generator: torch.Generator) -> torch.Tensor:
    """Each row's adapter slot for a batch shape (slots are a shuffled subset of 2 x adapters)."""
    slots = torch.randperm(2 * adapters, generator=generator)[:adapters]
    if shape == "decode, uniform":
        return slots.repeat_interleave(16)
    if shape == "decode, uneven":
        sizes = torch.randint(1, 32, (adapters,), generator=generator)
        rows = slots.repeat_interleave(sizes)
        return rows[torch.randperm(rows.numel(), generator=generator)]
    sizes = torch.randint(64, 192, (adapters,), generator=generator)  # prefill: each adapter's prompts, one run
    return slots.repeat_interleave(sizes)


def median_us(fn, repeats: int) -> float:
    return 1e6 * median_seconds(fn, repeats, warm=3)


def matmuls_only(x, groups, weights, y):
    """The products evora's op performs, with the gather and the scatter taken out."""
    inputs = x if groups.gather is None else x.index_select(0, groups.gather)
    if not groups.length:  # long runs or groups: one matmul pair each
        products = torch.empty(inputs.shape[0], y.shape[1])

        def loop():
            for start, end, group in groups.runs:
                torch.mm(inputs[start:end] @ weights.a[group].T, weights.b[group], out=products[start:end])

        return loop
    count, length = len(groups.slots), groups.length
    inputs = inputs.view(count, length, -1)
    out = y.view(count, length, -1) if groups.gather is None else torch.empty(count, length, y.shape[1])

    def batched():
        shrunk = torch.bmm(inputs, weights.a.transpose(1, 2))
        if groups.gather is None:
            out.baddbmm_(shrunk, weights.b)
        else:
            torch.bmm(shrunk, weights.b, out=out)

    return batched


def per_row_ops(ops, x, indices, lora_a, lora_b, slices, y):
    """vLLM's add_lora_linear over per-row ops: shrink each slice into a buffer, expand it into y."""

    def run():
        rank = lora_a[0].shape[2]
        buffers = [torch.zeros(x.shape[0], rank) for _ in slices]
        for a, buffer in zip(lora_a, buffers):
            ops.bgmv_shrink(x, a, buffer, indices, 1.0)
        offset = 0
        for b, buffer, size in zip(lora_b, buffers, slices):
            ops.bgmv_expand_slice(buffer, b, y, indices, offset, size, True)
            offset += size

    return run


@dataclass(frozen=True)
class LayerCase:
    """One LoRA layer's inputs for a batch: vLLM's stacked weights over 2 x adapters slots, the
    rows' slots, the rows, the output, the base weight, and evora's grouping and arrangement."""

    lora_a: tuple[torch.Tensor, ...]
    lora_b: tuple[torch.Tensor, ...]
    slices: tuple[int, ...]
    indices: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    base: torch.Tensor
    groups: grouped_ops.StepGroups
    weights: grouped_ops.GroupedWeights

    def evora_us(self, repeats: int) -> float:
        def op() -> None:
            grouped_ops.grouped_lora_linear(self.y, self.x, self.groups, self.weights, 1.0)

        return median_us(op, repeats)

    def base_us(self, repeats: int) -> float:
        return median_us(lambda: self.x @ self.base.T, repeats)


def layer_case(width: int, slices: tuple[int, ...], indices: torch.Tensor, args, generator) -> LayerCase:
    slots = 2 * args.adapters
    lora_a = tuple(torch.randn(slots, 1, args.rank, width, generator=generator) for _ in slices)
    lora_b = tuple(torch.randn(slots, 1, size, args.rank, generator=generator) for size in slices)
    x = torch.randn(indices.numel(), width, generator=generator)
    y = torch.zeros(indices.numel(), sum(slices))
    base = torch.randn(sum(slices), width, generator=generator)
    groups = grouped_ops.step_groups(indices, list(range(100, 100 + slots)))
    weights = grouped_ops.grouped_weights(lora_a, lora_b, groups, slices, torch.float32)
    return LayerCase(lora_a, lora_b, slices, indices, x, y, base, groups, weights)


def measure(layer: str, shape: str, args: argparse.Namespace) -> dict:
    from vllm.lora.ops import torch_ops as vllm_ops

    generator = torch.Generator().manual_seed(0)
    width, slices = LAYERS[layer]
    indices = batch_indices(shape, args.adapters, generator)
    case = layer_case(width, slices, indices, args, generator)
    x, y, groups, weights, lora_a, lora_b = case.x, case.y, case.groups, case.weights, case.lora_a, case.lora_b
    slots = 2 * args.adapters
    times = {
        "evora": case.evora_us(args.repeats),
        "its_matmuls": median_us(matmuls_only(x, groups, weights, y), args.repeats),
        "per_adapter": median_us(per_row_ops(grouped_ops, x, indices, lora_a, lora_b, slices, y), args.repeats),
        "vllm": median_us(per_row_ops(vllm_ops, x, indices, lora_a, lora_b, slices, y), args.repeats),
        "base_layer": case.base_us(args.repeats),
        "grouping_per_step": median_us(lambda: grouped_ops.step_groups(indices, list(range(slots))), args.repeats),
    }
    flops_lora = 2 * indices.numel() * args.rank * (len(slices) * width + sum(slices))
    return {
        "layer": layer,
        "shape": shape,
        "rows": indices.numel(),
        "microseconds": times,
        "evora_vs_its_matmuls": times["evora"] / times["its_matmuls"],
        "lora_share_of_flops": flops_lora / (2 * indices.numel() * width * sum(slices)),
        "lora_time_vs_base_layer": times["evora"] / times["base_layer"],
    }


def measure_width(name: str, shape: Shape, args: argparse.Namespace) -> dict:
    """One decoder layer's four LoRA products in an uneven decode step, against its four base
    matmuls, at `shape`'s widths (the same rows and groups at every width)."""
    generator = torch.Generator().manual_seed(0)
    indices = batch_indices("decode, uneven", args.adapters, generator)
    evora = base = 0.0
    for width, slices in layers_of(shape).values():
        case = layer_case(width, slices, indices, args, generator)
        evora += case.evora_us(args.width_repeats)
        base += case.base_us(args.width_repeats)
        del case  # 7B's gate_up weight alone is 0.5 GB in fp32
    flops_lora = sum(2 * args.rank * (len(slices) * width + sum(slices)) for width, slices in layers_of(shape).values())
    flops_base = sum(2 * width * sum(slices) for width, slices in layers_of(shape).values())
    return {
        "model": name,
        "hidden": shape.hidden,
        "intermediate": shape.intermediate,
        "rows": indices.numel(),
        "evora_microseconds": evora,
        "base_layers_microseconds": base,
        "lora_share_of_flops": flops_lora / flops_base,
        "evora_vs_base_layers": evora / base,
    }


def print_widths(widths: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"a decoder layer's LoRA products in an uneven decode step against its base matmuls: "
        f"{args.adapters} adapters, rank {args.rank}, {args.threads} threads (microseconds)"
    )
    for column in ("model", "hidden", "rows", "evora", "base layers", "LoRA FLOPs / base", "evora / base"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for w in widths:
        table.add_row(
            w["model"],
            str(w["hidden"]),
            str(w["rows"]),
            f"{w['evora_microseconds']:.0f}",
            f"{w['base_layers_microseconds']:.0f}",
            f"{w['lora_share_of_flops']:.1%}",
            f"{w['evora_vs_base_layers']:.1%}",
        )
    Console(width=170).print(table)


def print_table(rows: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"one LoRA product per layer call: {args.adapters} adapters, rank {args.rank}, "
        f"{args.threads} threads (microseconds)"
    )
    columns = (
        "layer",
        "batch",
        "rows",
        "evora",
        "its matmuls",
        "evora / matmuls",
        "per adapter",
        "vLLM",
        "base layer",
        "LoRA FLOPs / base",
        "LoRA time / base",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("layer", "batch") else "right")
    for r in rows:
        t = r["microseconds"]
        table.add_row(
            r["layer"],
            r["shape"],
            str(r["rows"]),
            f"{t['evora']:.0f}",
            f"{t['its_matmuls']:.0f}",
            f"{r['evora_vs_its_matmuls']:.2f}x",
            f"{t['per_adapter']:.0f}",
            f"{t['vllm']:.0f}",
            f"{t['base_layer']:.0f}",
            f"{r['lora_share_of_flops']:.1%}",
            f"{r['lora_time_vs_base_layer']:.1%}",
        )
    Console(width=170).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--width-repeats", type=int, default=10, help="timed repeats of the widths table")
    parser.add_argument(
        "--out", help="the results file (default: bench/results/cpu_lora.json; --smoke: in a temporary folder)"
    )
    parser.add_argument("--smoke", action="store_true", help="every layer, shape and op at the least size (CI)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.out is None:
        folder = Path(tempfile.mkdtemp(prefix="evora-bench-smoke-")) if args.smoke else RESULTS
        args.out = str(folder / "cpu_lora.json")
    torch.set_num_threads(args.threads)
    shapes = ("decode, uniform", "decode, uneven", "prefill")
    rows = [measure(layer, shape, args) for shape in shapes for layer in LAYERS]
    print_table(rows, args)
    widths = [measure_width(name, shape, args) for name, shape in (SMOKE_WIDTHS if args.smoke else WIDTHS).items()]
    print_widths(widths, args)
    worst = max(r["evora_vs_its_matmuls"] for r in rows)
    report = {"setup": vars(args), "rows": rows, "worst_evora_vs_its_matmuls": worst, "target": "<= 1.5"}
    report["widths"] = widths
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"evora's op at most {worst:.2f}x the matmuls it performs (target <= 1.5); wrote {args.out}")
    shares = ", ".join(f"{w['model']} {w['evora_vs_base_layers']:.1%}" for w in widths)
    print(f"the op against a decoder layer's base matmuls, uneven decode: {shares}")


if __name__ == "__main__":
    main()
