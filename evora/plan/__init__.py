"""From a command line to a run: compose the config (Hydra), validate it (pure rules), and
resolve it once into a `RunPlan` (model, layout, task splits, fitness, budget)."""
