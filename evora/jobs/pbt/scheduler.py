"""Ray's synchronous PBT with LoRALab's explore step (`evora/strategies/pbt/space.py`), and
every exploit written to lineage.jsonl. Its private Tune hooks are in `tune_private.py`."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ray.tune.experiment import Trial

from evora.jobs.pbt.tune_private import TunePrivate
from evora.lora.keys import noise_key
from evora.strategies.pbt.config import PBTConfig
from evora.strategies.pbt.space import KEYS, explore, member_id, module_sets
from evora.tracking.run_dir import LINEAGE_FILE


def mutations(space: PBTConfig) -> dict[str, list[Any]]:
    """What PBT may change, as Tune checks it (LoRALab's explore does the changing)."""
    return {
        "rank": list(space.ranks),
        "alpha_multiplier": list(space.alpha_multipliers),
        "learning_rate": list(space.learning_rates),
        "dropout": list(space.dropouts),
        "target_modules": module_sets(space),
    }


class LoraLabPBT(TunePrivate):
    """Ray's PBT with LoRALab's explore step, and every exploit written to lineage.jsonl.

    Seeded by the run: whom to clone (`tune_rng`, salt "pbt-scheduler") and how the clone
    explores (`rng`, salt "pbt-explore")."""

    def __init__(self, space: PBTConfig, run_dir: str, seed: int, **kwargs: Any):
        super().__init__(noise_key(seed, "pbt-scheduler"), hyperparam_mutations=mutations(space), **kwargs)
        self.space = space
        self.lineage_path = str(Path(run_dir) / LINEAGE_FILE)
        self.rng = random.Random(noise_key(seed, "pbt-explore"))

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Ray's synchronous PBT deadlocks after Tuner.restore when members resumed at
        different generations: an exploit copies the leader's train time to the clones,
        every member ends at or past the next sync point, and none may run
        (ray-project/ray#48616). Then the sync point moves to the laggards' next step."""
        trial = super().choose_trial_to_run(tune_controller)
        trials = tune_controller.get_trials()
        waiting = [t for t in trials if t.status in (Trial.PENDING, Trial.PAUSED)]
        if trial is None and waiting and not any(t.status == Trial.RUNNING for t in trials):
            self.sync_to_laggards(waiting)
            trial = super().choose_trial_to_run(tune_controller)
        return trial

    def new_config(self, trial: Trial, trial_to_clone: Trial) -> tuple[dict, dict]:
        old = trial_to_clone.config
        new, operations = explore(old, self.space, self.rng)
        # The result PBT ranked the parent by (its own record), not the trial's latest result,
        # which Tune can reset when it pauses and restarts the trial.
        last = self.ranked_result(trial_to_clone) or trial_to_clone.last_result or {}
        generation = int(last.get("generation", 0))
        record = {
            "generation": generation,
            "op": "exploit",
            "trial": trial.trial_id,
            "from_trial": trial_to_clone.trial_id,
            "parent": last.get("member", ""),
            "id": member_id(new, generation),
            "fitness": last.get("fitness"),
            "changes": {k: [old[k], new[k]] for k in KEYS if old[k] != new[k]},
            "operations": operations,
        }
        with open(self.lineage_path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        return new, operations
