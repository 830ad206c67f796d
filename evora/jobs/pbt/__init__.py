"""strategy=pbt's runner: the LoRALab-style hyperparameter GA, distributed as Ray Tune
population-based training (synchronous: every generation, all members train, then the bottom
fraction clones the top fraction and explores).

A trial trains its LoRA by gradient descent (`evora/training/lora_sft.py`) for
`steps_per_generation` steps, then is scored by the run's engine workers (one shared
EvaluationService actor, so trials do not each load an inference engine) on the selection
split: accuracy, perplexity of the reference answers and the composite fitness. Exploit copies
the parent's checkpoint; explore follows LoRALab's rules (`evora/strategies/pbt/space.py`); a
changed rank resizes the copied adapter by truncated SVD or zero-padding (`lora/resize.py`).

- `trial`: the Tune trainable (one member), and Tune's dict encoding -> typed `LoraSpec`;
- `scheduler`: Ray's PBT with LoRALab's explore step and lineage.jsonl;
- `tune_private`: every private Ray Tune attribute evora touches, checked against the Ray
  version it was written for;
- `records`: trials.jsonl, console lines and metrics.jsonl (one record per completed round);
- `experiment`: the Tuner (search space, scheduler, callbacks, storage);
- `run`: `run_pbt`, the job (Ray, the shared EvaluationService, the search);
- `finish`: held-out scores of every member, the best adapter, the run summary.

The registration (`evora/strategies/pbt/__init__.py`) names `evora.jobs.pbt.run:run_pbt`:
Ray Tune is imported only when a PBT job starts.
"""
