"""evora: evolve LoRA adapters of large language models on Ray and vLLM."""

__version__ = "0.1.0"
