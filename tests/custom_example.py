"""A user's own reward function and task class, loaded by dotted path in tests."""

from evora.tasks.builtin.addition import AdditionTask


def shout_score(completion: str, example) -> float:
    """1.0 when the completion is the answer written in upper case."""
    return 1.0 if completion.strip() == example.answer.upper() else 0.0


class EvenSumsTask(AdditionTask):
    """Addition restricted to even sums."""

    def splits(self):
        splits = super().splits()

        def keep(examples):
            return tuple(e for e in examples if int(e.answer) % 2 == 0)

        return type(splits)(keep(splits.train), keep(splits.selection), keep(splits.heldout))
