"""`evora data`: a task's data file, written in the format the task reads."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import ConfigError, EvoraError

PAPER_SIZE = 2200  # the paper's countdown.json since its commit of 2025-11-01: 200 train, 2,000 held-out


def main(argv: list[str]) -> None:
    """`evora data countdown [--from FILE] [--size N] [--seed S] [--out FILE]`: a Countdown file
    that task=countdown reads, in the ES paper's format (id, context, numbers, target, solution):
    the paper's countdown.json (--from; any of its versions) checked and written back, or a seeded
    draw from reasoning-gym's countdown dataset (the `tasks` extra: pip install -e '.[tasks]')."""
    import argparse

    parser = argparse.ArgumentParser(prog="evora data", description=main.__doc__)
    parser.add_argument("task", choices=["countdown"], help="the task whose data to write")
    parser.add_argument("--from", dest="source", default=None, help="a Countdown file, e.g. the paper's countdown.json")
    parser.add_argument("--size", type=int, default=PAPER_SIZE, help="problems to draw from reasoning-gym")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed")
    parser.add_argument("--out", default="countdown.json", help="where the file goes (then: task.data_path=<it>)")
    args = parser.parse_args(argv)
    try:
        records = _records(args.source, args.size, args.seed)
        from evora.tasks.countdown_data import write_records

        write_records(records, args.out)
    except EvoraError as error:
        die(error)
    origin = args.source or f"reasoning-gym's countdown, seed {args.seed}"
    print(f"wrote {args.out}: {len(records)} problems from {origin}; {_fit(len(records))}")


def _records(source: str | None, size: int, seed: int) -> list[dict]:
    from evora.tasks.countdown_data import drawn, from_file

    if source is not None:
        return from_file(source)
    if size < 1:
        raise ConfigError(f"--size={size}: must be >= 1")
    return drawn(size, seed)


def _fit(count: int) -> str:
    """How task=countdown's split (conf/task/countdown.yaml) takes `count` problems, or the sizes that fit them."""
    import yaml

    from evora.plan.compose import CONF_DIR

    task = yaml.safe_load((CONF_DIR / "task" / "countdown.yaml").read_text())
    train, heldout = task["train_size"], task["eval_size"]
    if count >= train + heldout:
        return f"task=countdown trains on the first {train} and holds out the last {heldout}"
    takes = f"task=countdown takes {train} + {heldout}: with this file, set"
    if count > train:  # the paper's file before 2025-11-01 had 2,000 records
        return f"{takes} task.eval_size={count - train}"
    return f"{takes} task.train_size, task.eval_size and task.prompts_per_generation to fit"
