"""The benches' stand-in for a real model: a ~26M-parameter Llama with random weights and the
tiny model's tokenizer (bench/throughput.py, bench/eggroll.py, bench/hf_device.py)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def build_bench_model(folder: Path) -> int:
    """Writes the model and its tokenizer to `folder`; returns its parameter count."""
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
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def bench_layout(run: Any, model: str) -> Any:
    """The adapter layout a bench's worker uses: the run's LoRA on every layer of `model`."""
    from evora.lora.layout import build_layout
    from evora.lora.modules import adaptable_modules

    lora = run.lora
    return build_layout(
        adaptable_modules(model),
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=lora.target_modules,
        layers=None,
        base_model=model,
    )


def median_seconds(work: Callable[[], Any], repeats: int, warm: int = 0) -> float:
    """The median wall time of `repeats` calls of `work`, after `warm` untimed ones (thread pools,
    the allocator, kernels' first runs)."""
    for _ in range(warm):
        work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
