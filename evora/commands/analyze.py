"""`evora analyze`: plots/ and report.md of a run folder, or sweep.png of a sweep folder."""

from __future__ import annotations

from evora.commands.exits import die
from evora.errors import ConfigError, EvoraError


def main(argv: list[str]) -> None:
    """`evora analyze <run or sweep folder>`: plots + report.md; prints the paths."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="evora analyze", description=main.__doc__)
    parser.add_argument("folder", help="a run folder, or a multirun sweep folder (with sweep_summary.json)")
    args = parser.parse_args(argv)
    try:
        folder = Path(args.folder)
        if not folder.is_dir():
            raise ConfigError(f"{folder}: no such folder")
        from evora.analysis.report import analyze

        paths = analyze(folder)
    except EvoraError as error:
        die(error)
    print("\n".join(str(p) for p in paths))
