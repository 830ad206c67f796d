"""Pure scoring functions: (completion, reference) -> float. No I/O, no Ray, vLLM or W&B,
and never `eval`: arithmetic goes through `safe_eval`."""
