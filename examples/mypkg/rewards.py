"""A reward function: `evora task.reward=mypkg.rewards:score` (with PYTHONPATH=examples)."""

import evora


def score(completion: str, example) -> float:
    """1.0 when the reference answer appears in the completion; example.prompt,
    example.answer and example.data are the task's example."""
    return 1.0 if example.answer in completion else 0.0


@evora.batch_reward
def batch_score(completions: list[str], examples: list) -> list[float]:
    """A reward over a batch (`evora task.reward=mypkg.rewards:batch_score`): one call scores up to
    task.reward_batch_size completions, where one model call or one request scores many."""
    return [1.0 if e.answer in c else 0.0 for c, e in zip(completions, examples)]
