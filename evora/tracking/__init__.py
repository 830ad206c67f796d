"""Run state on disk (checkpoints, metrics, config) and on the console / W&B."""
