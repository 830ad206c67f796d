"""engine=hf: transformers + PEFT, one adapter at a time through `generate`, prompts batched;
the reference every other engine is checked against, and the fallback without vLLM. It runs
every family PEFT adapts (linear, Conv1D, per-expert weights)."""

from evora.engines.registry import RESIDENT, register_engine

register_engine(
    "hf",
    engine="evora.engines.hf_engine:HFEngine",
    summary="transformers + PEFT: one adapter at a time, every model PEFT adapts",
    memory=RESIDENT,
    lm_eval_backend="hf",
)
