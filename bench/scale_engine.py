"""The scale bench's engine and per-process hook (bench/scale.py; not part of evora).

`BenchEngine` answers every request with one precomputed completion in constant time: no
model, no tokens run. Candidates are still materialised from the payload and their seeds by
the real worker (that is orchestration), then ignored here. Full-weight strategies (EGGROLL)
keep their fp32 master copies on the real worker; the engine only takes them.

`setup_process` runs in every Ray worker process of the bench's own Ray (its runtime_env's
`worker_process_setup_hook`): it points the engine name the bench's runs use ("hf", so the run
config validates unchanged) at `BenchEngine`; the product's shipped engine list is not touched.
The driver's timing is `scale_driver.py`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from evora.engines.base import AdapterRef, Completion, EngineSpec, Sampling

ANSWER = "42"  # what every request gets
ANSWER_IDS = (52, 50, 2)  # its token ids; only their count and KL's shapes matter


class BenchEngine:
    loads_from_memory = True  # candidates stay in memory (no tmpfs folder written per candidate)

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.weights: dict[str, Any] = {}
        self.completion = Completion(ANSWER, len(ANSWER_IDS), ANSWER_IDS)

    def generate(
        self,
        prompts: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        max_tokens: int | Sequence[int],
        sampling: Sequence[Sampling] | None = None,
    ) -> list[Completion]:
        return [self.completion] * len(prompts)

    def score(
        self, prompts: Sequence[list[int]], targets: Sequence[list[int]], adapters: Sequence[AdapterRef | None]
    ) -> list[list[float]]:
        return [[-1.0] * len(t) for t in targets]

    def kl_to_base(
        self,
        prompts: Sequence[list[int]],
        completions: Sequence[list[int]],
        adapters: Sequence[AdapterRef | None],
        base: Mapping[str, Any] | None = None,
    ) -> list[list[float]]:
        return [[0.0] * len(c) for c in completions]

    def release(self, adapters: Sequence[AdapterRef]) -> None:
        pass

    def base_weights(self, names: Sequence[str]) -> dict[str, Any]:
        from evora.lora.base_weights import read_weights

        return read_weights(self.spec.model, list(names), self.spec.revision)

    def set_base_weights(self, weights: Mapping[str, Any]) -> None:
        self.weights = dict(weights)  # references only: the worker's master copies

    def perturb_base(self, master: Mapping[str, Any], noise: Sequence[Any]) -> None:
        self.weights = dict(master)  # es_full's candidate, by seeds: orchestration only, nothing drawn

    def shutdown(self) -> None:
        self.weights = {}


# --- per-process hook ---------------------------------------------

ENGINE_NAME = "hf"  # the engine name the bench's runs use (validated as the product's own)


def setup_process() -> None:
    """Every Ray worker process of the bench's Ray: the engine name runs `BenchEngine` (its
    registration again, with this class)."""
    import dataclasses

    from evora.engines import get_engine, register_engine

    entry = get_engine(ENGINE_NAME)
    fields = {f.name: vars(entry)[f.name] for f in dataclasses.fields(entry) if f.name != "name"}
    register_engine(ENGINE_NAME, **{**fields, "engine": "scale_engine:BenchEngine"})
