"""A reward function: `evora task.reward=mypkg.rewards:score` (with PYTHONPATH=examples)."""


def score(completion: str, example) -> float:
    """1.0 when the reference answer appears in the completion; example.prompt,
    example.answer and example.data are the task's example."""
    return 1.0 if example.answer in completion else 0.0
