"""What the driver gives a gradient strategy (SFT, GRPO): the train split rendered exactly
as the engine workers render it, the task's reward through the same bounded scoring as
every strategy (`tasks/reward_pool.py`), the budget check, and the device it may train on
(a GPU when Ray gave the driver one: hardware.driver_gpus), and a sampler of completions on
the engine workers (GRPO's rollouts: `distributed/rollouts.py`)."""

from __future__ import annotations

from typing import Callable

import ray

from evora.distributed.pool import WorkerPool
from evora.distributed.rollouts import EngineRollouts
from evora.distributed.worker_spec import engine_spec, load_tokenizer
from evora.plan.run_plan import RunPlan
from evora.strategies import get_strategy
from evora.strategies.budget import Budget
from evora.strategies.protocol import Spend, TrainingContext
from evora.tasks.base import AnswerTask
from evora.tasks.prompts import PromptRenderer
from evora.tasks.reward_pool import Scorer, reward_scorer

UNPLANNED_STEPS = 10**9  # a budget ends the run: schedules see no end (constant after warm-up)


def training_context(
    plan: RunPlan, budget: Budget | None, spent: Callable[[Spend], bool], pool: WorkerPool
) -> tuple[TrainingContext, Scorer]:
    """The context, and the reward scorer behind it (the caller closes it); its sampler runs on
    `pool`'s engine workers."""
    run, task, model_path = plan.run, plan.task, plan.model_path
    tokenizer = load_tokenizer(engine_spec(run, model_path))
    renderer = PromptRenderer(tokenizer, run.task.prompt_format, task.plain_template, run.task.system_prompt)
    scorer = reward_scorer(task, run.task, run.seed)
    train = plan.splits.train

    def rewards(completions: list[str], indices: list[int]) -> list[float]:
        return scorer.score(completions, [train[i] for i in indices]).rewards

    def answer(completion: str, index: int) -> str | None:
        assert isinstance(task, AnswerTask)
        return task.answer(completion, train[index])

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps = get_strategy(run.strategy.name).kind.steps_per_generation(run.strategy)
    context = TrainingContext(
        seed=run.seed,
        layout=plan.layout,
        model_path=model_path,
        train=train,
        prompt_text=renderer.text,
        prompt_ids=renderer.ids,
        special_tokens=not renderer.chat,
        target_ids=renderer.target_ids,
        pad_id=pad,
        rewards=rewards,
        spent=spent,
        device="cuda" if _has_gpu() else "cpu",
        max_tokens=run.task.max_tokens,
        planned_steps=UNPLANNED_STEPS if budget is not None else run.generations * steps,
        answer=answer if isinstance(task, AnswerTask) else None,
        sample=EngineRollouts(pool),
    )
    return context, scorer


def _has_gpu() -> bool:
    return ray.is_initialized() and bool(ray.get_gpu_ids())
