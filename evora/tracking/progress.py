"""The console: a progress bar over generations and a one-line summary of each."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def generation_line(s: dict[str, Any]) -> str:
    heldout = f"  held-out {_fmt(s['heldout_reward'])}" if s.get("heldout_reward") is not None else ""
    return (f"gen {s['generation']:>4}/{s['generations']}  reward {_fmt(s['reward_mean'])} "
            f"[p20 {_fmt(s['reward_p20'])} p80 {_fmt(s['reward_p80'])} max {_fmt(s['reward_max'])}]"
            f"{heldout}  {s['seconds']:.1f}s  {s['tokens_per_second']:,.0f} tok/s")


def final_lines(s: dict[str, Any]) -> list[str]:
    counts = s["best_vs_base"]
    return [f"held-out reward: base model {_fmt(s['base_heldout'])} -> final {s['center']} adapter "
            f"{_fmt(s['final_heldout'])}"
            f" (best {_fmt(s['best_heldout'])} at generation {s['best_generation']})",
            f"best adapter vs base model, held-out: {counts['improvements']} improvements, {counts['regressions']} "
            f"regressions (eval/best_vs_base.md)",
            f"run folder: {s['run_dir']}  (adapters/{s['center']}, adapters/best: PEFT layout)"]


def pbt_final_lines(s: dict[str, Any]) -> list[str]:
    counts = s["best_vs_base"]
    converged = {None: "too few generations to tell", True: "yes", False: "no"}[s["converged"]]
    return [f"best member {s['best_member']}: held-out fitness {_fmt(s['best_heldout_fitness'])} (median member "
            f"{_fmt(s['median_trial_heldout_fitness'])}, base model {_fmt(s['base_heldout']['fitness'])})",
            f"best adapter vs base model, held-out: {counts['improvements']} improvements, {counts['regressions']} "
            f"regressions (eval/best_vs_base.md); converged (<1% over 5 generations): {converged}",
            f"run folder: {s['run_dir']}  (adapters/best: PEFT layout; lineage.jsonl, trials.jsonl)"]


class ConsoleProgress:
    def __init__(self, enabled: bool = True, console: Console | None = None):
        self.console = console or Console(soft_wrap=True, markup=False, highlight=False)
        self.progress = Progress(TextColumn("evolving"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TimeRemainingColumn(), console=self.console, disable=not enabled, transient=True)
        self.task = None

    def __enter__(self) -> "ConsoleProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def handle(self, summary: dict[str, Any]) -> None:
        kind = summary["kind"]
        if kind == "start":
            resumed = f", resumed at generation {summary['start']}" if summary["resumed"] else ""
            self.console.print(f"{summary['workers']} engine worker(s), {summary['adapter_parameters']:,} adapter "
                               f"parameters, set-up {summary['setup_seconds']:.0f}s{resumed}; held-out reward of "
                               f"the base model {_fmt(summary['base_heldout'])}")
            self.task = self.progress.add_task("generations", total=summary["generations"],
                                               completed=summary["start"])
        elif kind == "generation":
            self.console.print(generation_line(summary))
            self.progress.update(self.task, completed=summary["generation"])
        elif kind == "final":
            for line in final_lines(summary):
                self.console.print(line)
        elif kind == "driver-restart":
            self.console.print(f"the driver was lost; restarted from the last checkpoint "
                               f"(restart {summary['restarts']})")
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None
        elif kind == "pbt-start":
            resumed = " (resumed)" if summary["resumed"] else ""
            self.console.print(f"population-based training: {summary['population']} members, "
                               f"{summary['generations']} generations{resumed}")
        elif kind == "pbt-final":
            for line in pbt_final_lines(summary):
                self.console.print(line)
