"""How completions are decoded, per split: greedy (the default, the ES paper's setting) or
sampled, several samples per (candidate, prompt) cell, each with its own seed.

Search (the train split) decodes with task.temperature / top_p / samples and turns a cell's
samples into one reward and correctness with task.aggregate (`tasks/aggregate.py`);
held-out and selection decode with the eval_ settings and report pass@1 and pass@k. A
sample's seed is a pure function of (run seed, split, generation and candidate (the spec's
label), prompt, sample), so fixed work units give bitwise the same completions whichever
worker runs them, and a resumed run draws what the uninterrupted one drew. Evaluations
(the base model, a center, a portfolio's members) share one stream per (split, prompt,
sample): common random numbers, so base and best differ by their weights, not their draws."""

from __future__ import annotations

from dataclasses import dataclass

from evora.config.schema import TaskConfig
from evora.lora.keys import noise_key


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    samples: int = 1
    aggregate: str = "mean"
    k: int = 1  # pass_at_k's k (search), or the k of the pass@k evaluations report

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def search_decoding(task: TaskConfig) -> Decoding:
    return Decoding(task.temperature, task.top_p, task.samples, task.aggregate, task.k)


def eval_decoding(task: TaskConfig) -> Decoding:
    """Held-out and selection: every sample counts (mean: pass@1), and pass@eval_k is reported."""
    k = task.eval_k if task.eval_k is not None else task.eval_samples
    return Decoding(task.eval_temperature, task.eval_top_p, task.eval_samples, "mean", k)


def decoding_of(task: TaskConfig, split: str) -> Decoding:
    return search_decoding(task) if split == "train" else eval_decoding(task)


def sample_seed(run_seed: int, split: str, candidate: str, prompt: int, sample: int) -> int:
    """The seed of one sample's random stream; `candidate` is the spec's label (it names the
    generation): the same candidate on the same prompt draws the same samples anywhere."""
    return noise_key(run_seed, "sample", split, candidate, prompt, sample)
