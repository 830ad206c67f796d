"""The console: a progress bar over generations and a one-line summary of each."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from evora.tracking.events import Event, PoolEvent, WorkerReplaced

MASTER_PLACES = {"cuda": ", on the GPU", "cpu": ", on the host"}


def idle_line(event: Event) -> str | None:
    """One line when a generation's work units leave engine workers idle."""
    units, workers = event.get("units"), event["workers"]
    if units is None or units >= workers:
        return None
    return (
        f"warning: {units} work unit(s) a generation for {workers} engine workers: {workers - units} idle every "
        f"generation; raise hardware.min_units to {workers} (engine.units=fixed then cuts the prompts too)"
    )


def _fmt(value: float | None) -> str:
    return "  -  " if value is None else f"{value:.3f}"


def generation_line(s: Event, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """One generation; `extra` are the strategy's own (metrics key, label) pairs (its registry entry)."""
    heldout = f"  held-out {_fmt(s['heldout_reward'])}" if s.get("heldout_reward") is not None else ""
    own = "".join(f"  {label} {_fmt(s[key])}" for key, label in extra if s.get(key) is not None)
    of = f"/{s['generations']}" if s.get("generations") else ""  # a budget ends the run: no known total
    population = (  # gradient strategies have no population to summarise
        f"  reward {_fmt(s['reward_mean'])} "
        f"[p20 {_fmt(s['reward_p20'])} p80 {_fmt(s['reward_p80'])} max {_fmt(s['reward_max'])}]"
        if "reward_mean" in s
        else ""
    )
    speed = f"  {s['tokens_per_second']:,.0f} tok/s" if "tokens_per_second" in s else ""
    return f"gen {s['generation']:>4}{of}{population}{heldout}{own}  {s['seconds']:.1f}s{speed}"


def stop_line(s: Event) -> str | None:
    """One line when the strategy ends the run after this generation (Told.stop: its reason)."""
    if s.get("stop") is None:
        return None
    return f"the strategy ends the run after generation {s['generation']}: {s['stop']}"


def members_report(start: Event) -> bool:
    """Whether the run's members report themselves. The start event's optional `population` is part
    of its contract: a strategy that runs its own job (a registry `runner`) and trains its members
    as trials of its own names how many there are; each prints its own line as it finishes, out of
    generation order, so the console draws no generation bar. The shared loop's start event has no
    `population`: its generations report through `generation_line`."""
    return start.get("population") is not None


def pool_line(change: PoolEvent) -> str:
    """A worker lost or replaced (the pool's events; units are rerun, results do not change)."""
    if isinstance(change, WorkerReplaced):
        return f"engine worker {change.worker} started as a replacement (node {change.node[:12]})"
    if change.hung_s is not None:
        return (
            f"engine worker {change.worker} gave no result in {change.hung_s:g} s (engine.unit_timeout_s): "
            "killed; its work is rerun on the others"
        )
    return f"engine worker {change.worker} lost; its work is rerun on the others"


def final_lines(event: Event) -> list[str]:
    """The run's end, from its summary (the one schema every strategy writes)."""
    s, run_dir = event["summary"], event["run_dir"]
    base, best, final = s["base"], s["best"], s["final"]
    found = f" at generation {s['best_generation']}" if s["best_generation"] is not None else ""
    found += f", best member {s['best_member']}" if s["best_member"] else ""
    whole = "model" in s["adapters"]  # a full-weight run: its result is a model, not an adapter
    final_name = "model" if whole else f"{s['center']} adapter"
    final_text = f" -> final {final_name} {_fmt(final['reward'])}" if final else ""
    counts, flops = s["best_vs_base"], s["compute"]["search"]["flops"]
    lines = [
        f"held-out reward: base model {_fmt(base['reward'])}{final_text} (best {_fmt(best['reward'])}{found})",
        f"best {'model' if whole else 'adapter'} vs base model, held-out: {counts['improvements']} improvements, "
        f"{counts['regressions']} regressions"
        + (f", {counts['failed']} failed rewards" if counts.get("failed") else "")
        + " (eval/best_vs_base.md)",
        f"compute: {flops:.3g} FLOPs searching, {s['compute']['seconds']['total']:.0f}s in all",
    ]
    # Per-member numbers stay in the summary; the console shows the strategy's headline findings.
    lines += [
        f"{key.replace('_', ' ')}: {_detail(value)}"
        for key, value in s["details"].items()
        if not isinstance(value, dict) or not any(isinstance(v, float) for v in value.values())
    ]
    folders = ("model", "best_model")  # full-weight runs export whole models too
    paths = sorted(s["adapters"].values())
    adapters = ", ".join(p for p in paths if p not in folders)
    models = ", ".join(p for p in paths if p in folders)
    exported = f"{adapters}: PEFT layout" + (f"; {models}: model folders" if models else "")
    return lines + [f"run folder: {run_dir}  ({exported})"]


def _detail(value: Any) -> str:
    if isinstance(value, float):
        return _fmt(value)
    if value is None:
        return "too few generations to tell"
    return str(value)


class ConsoleProgress:
    def __init__(self, enabled: bool = True, console: Console | None = None, extra: tuple[tuple[str, str], ...] = ()):
        self.extra = extra
        self.console = console or Console(soft_wrap=True, markup=False, highlight=False)
        self.progress = Progress(
            TextColumn("evolving"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not enabled,
            transient=True,
        )
        self.task: TaskID | None = None  # the generation bar (none while members report themselves)

    def __enter__(self) -> "ConsoleProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def handle(self, event: Event) -> None:
        kind = event["kind"]
        if kind == "start":
            self._start(event)
        elif kind == "generation":
            for change in event.get("pool_events", ()):
                self.console.print(pool_line(change))
            self.console.print(generation_line(event, self.extra))
            stop = stop_line(event)
            if stop is not None:
                self.console.print(stop)
            if self.task is not None:
                self.progress.update(self.task, completed=event["generation"])
        elif kind == "final":
            for line in final_lines(event):
                self.console.print(line)
        elif kind == "driver-restart":
            self.console.print(f"the driver was lost; restarted from the last checkpoint (restart {event['restarts']})")
            if self.task is not None:
                self.progress.remove_task(self.task)
                self.task = None

    def _start(self, event: Event) -> None:
        resumed = f", resumed at generation {event['start']}" if event["resumed"] else ""
        parts = [f"strategy {event['strategy']}", f"{event['workers']} engine worker(s)"]
        if event.get("population") is not None:  # a job's members, see members_report
            parts.append(f"{event['population']} members")
        if event.get("adapter_parameters") is not None:
            parts.append(f"{event['adapter_parameters']:,} adapter parameters")
        if event.get("full_weights") is not None:
            mib, where = event["master_bytes"] / 2**20, MASTER_PLACES.get(event.get("master_device", "cpu"), "")
            parts.append(
                f"{event['full_weights']:,} weights moved ({mib:,.1f} MiB of fp32 master copies per worker{where})"
            )
        if event.get("units") is not None:
            parts.append(f"{event['units']} work units a generation")
        base = event.get("base_heldout")
        self.console.print(
            ", ".join(parts)
            + f", set-up {event['setup_seconds']:.0f}s{resumed}"
            + (f"; held-out reward of the base model {_fmt(base)}" if base is not None else "")
        )
        for line in (idle_line(event), event.get("device_change")):
            if line:
                self.console.print(line)
        if not members_report(event):
            self.task = self.progress.add_task("generations", total=event["generations"], completed=event["start"])
