"""Every private part of Ray Tune's `PopulationBasedTraining` that evora relies on, in one
place, written for one Ray version (`WRITTEN_FOR`, the version pyproject.toml pins): a PBT
job on another Ray stops at its start with one line (`require_written_for_this_ray`), since
a renamed hook would silently drop LoraLabPBT's explore step and lineage.

- `_get_new_config(trial, trial_to_clone)`: the hook Tune calls on every exploit; evora's is
  `TunePrivate.new_config` (LoRALab's explore, and the lineage record). Ray's public
  `custom_explore_fn` sees only the config, not which trial clones which.
- `_trial_state[trial].last_result`: the result PBT ranked a trial by (`ranked_result`).
- `_trial_state[t].last_train_time`, `_next_perturbation_sync`, `_perturbation_interval`:
  moved when a restored synchronous run would deadlock (`sync_to_laggards`,
  ray-project/ray#48616).
- the module-level `random` of `ray.tune.schedulers.pbt`: PBT draws whom to clone with
  Python's global RNG and has no seed of its own; while PBT handles a result it draws from
  the scheduler's own seeded `random.Random` instead (`seeded_tune_random`), and the
  process's global RNG is neither seeded nor used.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining

from evora.errors import RunError

WRITTEN_FOR = "2.60"


def ray_version() -> str:
    import ray

    return ray.__version__


def require_written_for_this_ray() -> None:
    version = ray_version()
    if version.split(".")[:2] != WRITTEN_FOR.split("."):
        raise RunError(
            f"strategy=pbt relies on Ray Tune internals written for Ray {WRITTEN_FOR}.x, not {version}: "
            f"install ray=={WRITTEN_FOR}.* (pyproject.toml pins it) or port evora/jobs/pbt/tune_private.py"
        )


@contextmanager
def seeded_tune_random(rng: random.Random) -> Iterator[None]:
    """Ray's PBT module draws from `rng` (not Python's global RNG) inside the block."""
    from ray.tune.schedulers import pbt

    module_random = getattr(pbt, "random")  # the module's own import, not a public name
    setattr(pbt, "random", rng)  # a Random has the module functions PBT calls (choice, random, uniform)
    try:
        yield
    finally:
        setattr(pbt, "random", module_random)


class TunePrivate(PopulationBasedTraining):
    """Ray's PBT with its private hooks behind public names; `tune_rng` seeds whom to clone."""

    def __init__(self, tune_seed: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.tune_rng = random.Random(tune_seed)

    def new_config(self, trial: Trial, trial_to_clone: Trial) -> tuple[dict, dict]:
        """The config `trial` continues with after cloning `trial_to_clone`, and what changed."""
        raise NotImplementedError

    def _get_new_config(self, trial: Trial, trial_to_clone: Trial) -> tuple[dict, dict]:
        return self.new_config(trial, trial_to_clone)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        with seeded_tune_random(self.tune_rng):
            return super().on_trial_result(tune_controller, trial, result)

    def ranked_result(self, trial: Trial) -> dict | None:
        """The result PBT ranked `trial` by (None before its first)."""
        state = self._trial_state.get(trial)
        return state.last_result if state is not None else None

    def sync_to_laggards(self, waiting: list[Trial]) -> None:
        """The next synchronisation point: one interval past the laggards' last result."""
        last = min(self._trial_state[t].last_train_time for t in waiting)
        self._next_perturbation_sync = last + self._perturbation_interval
