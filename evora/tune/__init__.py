"""Population-based training of LoRA hyperparameters (seed 000) on Ray Tune."""
