"""`evora compare`: several runs side by side."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """`evora compare <run or sweep folder> ... [--out D]`: a table, compare.md/.json and plots/
    (compare.png: reward against compute; reward_kl.png: the reward-KL plane)."""
    import argparse

    from evora.analysis.compare import compare, print_table

    parser = argparse.ArgumentParser(prog="evora compare", description=main.__doc__)
    parser.add_argument("folders", nargs="+", help="run folders, or multirun sweep folders")
    parser.add_argument(
        "--out",
        default=None,
        help="where compare.md and plots/ go (default: a sweep folder itself, else runs/compare-<time>)",
    )
    args = parser.parse_args(argv)
    try:
        rows, paths = compare(args.folders, args.out)
    except EvoraError as error:
        die(error)
    print_table(rows)
    print("\n".join(str(p) for p in paths))
