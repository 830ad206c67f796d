"""Reports and comparisons built from a run's outputs. No Ray, vLLM or W&B here."""
