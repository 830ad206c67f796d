"""task.reward=reward_model on an accelerator (issue 40): evora's RewardModelRewards, the scorer engine
workers build, on a random-weight sequence classifier at a real width, on --device against the CPU.

    PYTHONPATH=. python bench/reward_model_device.py [--device cuda] [--layers 24] [--out FILE]
    python bench/reward_model_device.py --smoke        (CI: tiny sizes, on the CPU where there is no GPU)

  parity      the same fp32 model on the device and on the CPU: the largest difference of the rewards
              (batched, padded), and bf16 on the device against fp32 (what `dtype=auto` gives a GPU)
  throughput  completions scored per second, batched (--batch), on the CPU (fp32) and on the device
              (fp32, bf16), the median of --repeats

The classifier is Qwen2.5-0.5B's shape (hidden 896, 14 heads, 2 KV heads, MLP 4864; --layers of its
24) with one output, built from transformers' config class, and the bundled tiny model's tokenizer
(so a 512-token vocabulary, not Qwen's 151,936: the embedding is the only part that differs).
Texts are prompt + completion of about --chars characters (the tokenizer is byte-level: about
one token each).

Results: bench/results/reward_model_device.json (--out); the table on stdout.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # evora from this checkout

from evora.config.schema import RewardModelConfig, TaskConfig  # noqa: E402
from evora.tasks.base import Example  # noqa: E402
from evora.tasks.reward_model import RewardModelRewards  # noqa: E402

TINY = ROOT / "evora" / "models" / "tiny"


def build_classifier(folder: Path, layers: int, smoke: bool) -> Path:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    hidden, mlp, heads = (64, 128, 4) if smoke else (896, 4864, 14)
    config = Qwen2Config(
        vocab_size=512, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    config.num_labels = 1  # one output: the reward
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(folder)
    return folder


def texts(count: int, chars: int) -> tuple[list[str], list[Example]]:
    rng = random.Random(0)
    digits = "0123456789+= "
    examples = [Example("".join(rng.choice(digits) for _ in range(chars // 4)), "0") for _ in range(count)]
    completions = ["".join(rng.choice(digits) for _ in range(rng.randint(chars // 2, chars))) for _ in range(count)]
    return completions, examples


def scorer(folder: Path, device: str, dtype: str, batch: int) -> RewardModelRewards:
    cfg = TaskConfig(reward="reward_model", reward_model=RewardModelConfig(str(folder), batch_size=batch, dtype=dtype))
    return RewardModelRewards(cfg, device)


def timed(rewards: RewardModelRewards, completions: list[str], examples: list[Example], repeats: int) -> float:
    rewards.score(completions[: rewards.rm.batch_size], examples[: rewards.rm.batch_size])  # warm-up
    seconds = []
    for _ in range(repeats):
        if rewards.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        rewards.score(completions, examples)
        if rewards.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return len(completions) / statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--count", type=int, default=512, help="completions scored per timing")
    parser.add_argument("--cpu-count", type=int, default=64, help="completions scored per CPU timing")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--chars", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "reward_model_device.json"))
    args = parser.parse_args()
    if args.smoke:
        args.layers, args.count, args.cpu_count, args.batch, args.chars, args.repeats = 2, 8, 8, 4, 32, 1
    folder = build_classifier(Path(tempfile.mkdtemp(prefix="evora-rm-")), args.layers, args.smoke)
    completions, examples = texts(args.count, args.chars)
    head = args.cpu_count
    cpu = scorer(folder, "cpu", "float32", args.batch)
    device32, device16 = (scorer(folder, args.device, dtype, args.batch) for dtype in ("float32", "bfloat16"))
    reference = cpu.score(completions[:head], examples[:head]).rewards
    on_device = device32.score(completions[:head], examples[:head]).rewards
    in_bf16 = device16.score(completions[:head], examples[:head]).rewards
    spread = max(abs(r) for r in reference) or 1.0
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "layers": args.layers,
        "batch": args.batch,
        "chars": args.chars,
        "fp32_device_vs_cpu_max_abs": max(abs(a - b) for a, b in zip(on_device, reference)),
        "bf16_vs_fp32_max_abs_over_max_reward": max(abs(a - b) for a, b in zip(in_bf16, reference)) / spread,
        "per_second": {
            "cpu fp32": timed(cpu, completions[:head], examples[:head], args.repeats),
            f"{args.device} (device) fp32": timed(device32, completions, examples, args.repeats),
            f"{args.device} (device) bf16": timed(device16, completions, examples, args.repeats),
        },
    }
    shape = "smoke: tiny widths" if args.smoke else f"{args.layers} layers at Qwen2.5-0.5B's width"
    print(f"| reward model ({shape}) | {result['device']} |")
    print("|---|---|")
    print(
        f"| fp32 on {args.device} vs the CPU, largest reward difference | {result['fp32_device_vs_cpu_max_abs']:.2e} |"
    )
    print(
        f"| bf16 vs fp32, largest difference / largest reward | {result['bf16_vs_fp32_max_abs_over_max_reward']:.2e} |"
    )
    for name, rate in result["per_second"].items():
        print(f"| completions scored per second, {name} (batch {args.batch}) | {rate:.0f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
