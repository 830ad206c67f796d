"""`evora runs`: list, show or clean run folders."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import EvoraError


def main(argv: list[str]) -> None:
    """`evora runs list [--dir D] | show <run> | clean [--keep N] [--yes] [--dir D] [--scratch /dev/shm]`."""
    import argparse

    from evora import runs

    parser = argparse.ArgumentParser(prog="evora runs", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list").add_argument("--dir", default="runs")
    commands.add_parser("show").add_argument("run")
    clean = commands.add_parser("clean", help="delete old run folders, and scratch folders of dead runs")
    clean.add_argument("--keep", type=int, default=None, help="keep the N newest finished runs (omit: delete none)")
    clean.add_argument("--yes", action="store_true")
    clean.add_argument("--dir", default="runs")
    clean.add_argument("--scratch", default=runs.SCRATCH_ROOT, help="candidate adapters' folder (engine.adapter_dir)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            runs.print_runs(args.dir)
        elif args.command == "show":
            runs.show_run(args.run)
        else:
            if args.keep is not None:
                deleted = runs.clean_runs(args.dir, args.keep, args.yes)
                print("\n".join(f"deleted {run}" for run in deleted))
            swept = runs.sweep_dead_scratch(args.scratch)
            print(f"removed {swept} scratch folder(s) of runs no longer alive ({args.scratch}/evora-*)")
    except EvoraError as error:
        die(error)
