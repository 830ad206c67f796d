"""Tiny random-weight models of real architectures, from transformers' own config classes,
with the bundled tokenizer: `python -m evora.models.build_family gpt2 --out DIR`.

For trying a family offline (`evora model.path=DIR engine=hf ...`) and for the test suite's
architecture matrix. Head dimension 32 (vLLM's CPU attention needs >= 32); 2 layers; weights
drawn from the config's own initialiser under a fixed seed, so the same family gives the
same model.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any, Callable

from evora.models import BUNDLED_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
COMMON: dict[str, Any] = dict(vocab_size=472, bos_token_id=1, eos_token_id=2, pad_token_id=0)
DECODER: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=512, **COMMON
)


def _llama() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=32, **DECODER)


def _qwen2() -> Any:  # attention biases, tied embeddings
    from transformers import Qwen2Config

    return Qwen2Config(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, **DECODER)


def _qwen3() -> Any:  # q/k norms
    from transformers import Qwen3Config

    return Qwen3Config(num_attention_heads=2, num_key_value_heads=1, head_dim=32, **DECODER)


def _mistral() -> Any:
    from transformers import MistralConfig

    return MistralConfig(num_attention_heads=2, num_key_value_heads=1, head_dim=32, **DECODER)


def _gemma2() -> Any:  # logit soft-capping, sliding-window layers
    from transformers import Gemma2Config

    return Gemma2Config(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64, **DECODER)


def _phi3() -> Any:  # fused qkv_proj and gate_up_proj
    from transformers import Phi3Config

    return Phi3Config(num_attention_heads=2, num_key_value_heads=2, **DECODER)


def _gpt2() -> Any:  # transformers' Conv1D layers, weights stored [in, out]
    from transformers import GPT2Config

    return GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=512, **COMMON)


def _qwen3_moe() -> Any:  # 4 experts, 2 per token, fused 3-D expert weights in transformers 5
    from transformers import Qwen3MoeConfig

    # head_dim is missing from Qwen3MoeConfig's signature (transformers 5), yet the config takes and keeps it.
    undeclared: dict[str, Any] = dict(head_dim=32)
    return Qwen3MoeConfig(
        num_attention_heads=2,
        num_key_value_heads=1,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        **undeclared,
        **DECODER,
    )


FAMILIES: dict[str, Callable[[], Any]] = {
    "llama": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "mistral": _mistral,
    "gemma2": _gemma2,
    "phi3": _phi3,
    "gpt2": _gpt2,
    "qwen3_moe": _qwen3_moe,
}


def build_family(family: str, out: str | Path, seed: int = 0) -> Path:
    """Write a tiny random `family` model with the bundled tokenizer to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = FAMILIES[family]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder = Path(out)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(Path(BUNDLED_DIR) / "tiny" / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    print(build_family(args.family, args.out))


if __name__ == "__main__":
    main()
