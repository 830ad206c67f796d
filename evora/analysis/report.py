"""<run>/report.md: what was run, what came out, the curves, and findings computed from
the data, so that a run folder explains itself without a notebook. Also a short
sweep report for a multirun folder. No Ray, vLLM or W&B here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evora.analysis.compare import read_row, strategy_table_lines, sweep_jobs
from evora.analysis.hooks import entry_of, run_data, run_hooks
from evora.analysis.plots import PHASES, PLOTS_DIR, SWEEP_SUMMARY, sweep_groups, write_plots, write_sweep_plot
from evora.strategies.analysis_hooks import Analysis
from evora.tracking.run_dir import LINEAGE_FILE
from evora.tracking.summary import headline

REPORT = "report.md"
PLOT_TITLES = {
    "reward": "Reward / fitness over generations",
    "timing": "Time per generation",
    "lineage": "Family tree",
    "mutations": "Mutation effectiveness",
}


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def _configuration(config: dict[str, Any]) -> list[str]:
    strategy = config.get("strategy", {})
    keys = _report_keys(strategy.get("name"))
    params = ", ".join(f"{k}={strategy[k]}" for k in keys if k in strategy)
    return [
        "## Configuration",
        "",
        f"- model: `{config.get('model', {}).get('name')}` ({config.get('model', {}).get('path')})",
        f"- task: `{config.get('task', {}).get('name')}`",
        f"- strategy: `{strategy.get('name')}` ({params})",
        f"- generations: {config.get('generations')}, seed: {config.get('seed')}",
        "",
    ]


def _report_keys(name: str | None) -> tuple[str, ...]:
    entry = entry_of(name)  # None: a user's strategy that is not importable here; the report still renders
    return entry.report_keys if entry is not None else ()


def outcome(summary: dict[str, Any]) -> dict[str, Any]:
    """base / final / best held-out rewards from eval/summary.json."""
    return {
        "base": headline(summary, "base"),
        "final": headline(summary, "final"),
        "best": headline(summary, "best"),
        "best_generation": summary.get("best_generation"),
        "best_member": summary.get("best_member"),
    }


def _best_variant(run: Path, summary: dict[str, Any]) -> list[str]:
    numbers = outcome(summary)
    lines = ["## Best variant", ""]
    if not summary:
        return lines + ["No eval/summary.json: the run did not finish.", ""]
    lines.append(f"- best held-out reward: {_fmt(numbers['best'])}")
    if numbers["best_generation"] is not None:
        lines.append(f"- from generation {numbers['best_generation']}")
    if numbers["best_member"]:
        lines.append(f"- best member: `{numbers['best_member']}` {summary['details'].get('best_hyperparameters', '')}")
    lines.append(f"- adapter: `adapters/best` (PEFT layout; `{run.resolve() / 'adapters' / 'best'}`)")
    exported = summary["adapters"]
    if "model" in exported:  # a full-weight run: the best generation's whole model
        folder = exported.get("best_model", exported["model"])
        lines.append(f"- model: `{folder}/` (a complete model folder; `{run.resolve() / folder}`)")
    return lines + [""]


def _final_metrics(summary: dict[str, Any]) -> list[str]:
    n = outcome(summary)
    return [
        "## Final metrics (held-out)",
        "",
        "| base model | final | best |",
        "| --- | --- | --- |",
        f"| {_fmt(n['base'])} | {_fmt(n['final'])} | {_fmt(n['best'])} |",
        "",
        *_compute(summary),
    ]


def _compute(summary: dict[str, Any]) -> list[str]:
    compute = summary.get("compute")
    if not compute:
        return []
    search, evaluation = compute["search"], compute["evaluation"]
    return [
        f"Compute: {search['flops']:.3g} FLOPs searching ({search['tokens_generated']:,} tokens generated, "
        f"{search['tokens_trained']:,} trained), {evaluation['flops']:.3g} evaluating; "
        f"{compute['seconds']['total']:.0f} s wall-clock (2 x P x tokens per forward pass, 6 x P x tokens trained, "
        f"P = {compute['parameters']:,} parameters).",
        "",
    ]


def _curves(plots: list[Path], hooks: Analysis) -> list[str]:
    titles = {**PLOT_TITLES, **hooks.titles}
    lines = ["## Curves", ""]
    for path in plots:
        lines += [f"### {titles.get(path.stem, path.stem)}", "", f"![{path.stem}]({PLOTS_DIR}/{path.name})", ""]
    return lines


def _comparison(comparison: dict[str, Any]) -> list[str]:
    if not comparison:
        return []
    counts, base, adapter = (
        comparison.get("counts", {}),
        comparison.get("base_metrics", {}),
        comparison.get("adapter_metrics", {}),
    )
    lines = [
        "## Best adapter vs base model",
        "",
        f"On {comparison.get('examples')} {comparison.get('split')} examples of `{comparison.get('task')}`: "
        + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items())
        + ".",
        "",
        "| metric | base | adapter |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {k} | {_fmt(base.get(k))} | {_fmt(adapter.get(k))} |" for k in adapter]
    return lines + ["", "Examples: `eval/best_vs_base.md`.", ""]


def findings(metrics: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """Sentences computed from the data; each is left out when its data is missing."""
    found = []
    n = outcome(summary)
    if n["base"] is not None and n["best"] is not None:
        found.append(
            f"The best adapter scores {n['best']:.4f} held-out against the base model's {n['base']:.4f} "
            f"({n['best'] - n['base']:+.4f})."
        )
    if n["best_generation"] is not None and summary.get("generations"):
        found.append(f"The best adapter comes from generation {n['best_generation']} of {summary['generations']}.")
    return found + _heldout_peak(metrics) + _slowest_phase(metrics)


def _heldout_peak(metrics: list[dict[str, Any]]) -> list[str]:
    heldout = [(r["generation"], r["heldout_reward"]) for r in metrics if r.get("heldout_reward") is not None]
    if len(heldout) < 2:
        return []
    peak = max(heldout, key=lambda p: p[1])
    if peak[0] < heldout[-1][0] and peak[1] > heldout[-1][1]:
        return [
            f"The held-out reward peaked at generation {peak[0]} ({peak[1]:.4f}) and ended at "
            f"{heldout[-1][1]:.4f}: the final adapter is not the best one; use adapters/best."
        ]
    return [f"The held-out reward was still at its highest at the last evaluation (generation {heldout[-1][0]})."]


def _slowest_phase(metrics: list[dict[str, Any]]) -> list[str]:
    totals = {k: sum(r.get(k) or 0.0 for r in metrics) for k in PHASES}
    total = sum(totals.values())
    if total <= 0:
        return []
    slowest = max(totals, key=lambda k: totals[k])
    return [
        f"`{slowest.removeprefix('seconds_')}` takes {100 * totals[slowest] / total:.0f}% of the "
        f"measured generation time."
    ]


def write_report(run_dir: str | Path, plots: list[Path] | None = None) -> Path:
    run = run_data(run_dir)
    hooks = run_hooks(run)
    summary, comparison = dict(run.summary), _json(run.path / "eval" / "best_vs_base.json")
    plots = write_plots(run.path) if plots is None else plots
    lines = [f"# Run report: {run.path.name}", ""]
    lines += _configuration(dict(run.config)) + _best_variant(run.path, summary) + _final_metrics(summary)
    lines += hooks.report(run) if hooks.report is not None else []  # the strategy's own section
    found = findings(run.metrics, summary) + (hooks.findings(run) if hooks.findings is not None else [])
    lines += ["## Notable findings", ""] + [f"- {f}" for f in found] + [""]
    lines += _curves(plots, hooks) + _comparison(comparison)
    if (run.path / LINEAGE_FILE).exists():
        lines += [f"Lineage records: {len(run.lineage)} (`{LINEAGE_FILE}`).", ""]
    path = run.path / REPORT
    path.write_text("\n".join(lines))
    return path


def is_sweep(folder: str | Path) -> bool:
    return (Path(folder) / SWEEP_SUMMARY).exists()


def write_sweep_report(sweep_dir: str | Path) -> list[Path]:
    """sweep.png plus report.md: one row per override set, seeds pooled."""
    folder = Path(sweep_dir)
    plot = write_sweep_plot(folder)
    groups = sweep_groups(json.loads((folder / SWEEP_SUMMARY).read_text()))
    lines = [
        f"# Sweep report: {folder.name}",
        "",
        "| overrides | seeds | mean | min | max |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, values in sorted(groups.items(), key=lambda kv: -sum(kv[1]) / len(kv[1])):
        lines.append(
            f"| `{key}` | {len(values)} | {sum(values) / len(values):.4f} | {min(values):.4f} | {max(values):.4f} |"
        )
    lines += ["", f"![sweep]({PLOTS_DIR}/{plot.name})", ""]
    lines += _sweep_tables(folder)
    path = folder / REPORT
    path.write_text("\n".join(lines))
    return [plot, path]


def _sweep_tables(folder: Path) -> list[str]:
    """The tables the sweep's strategies add to `evora compare`, over its jobs (named by job number)."""
    rows = [read_row(job.name, job) for job in sweep_jobs(folder)]
    section = strategy_table_lines(rows)
    return [*section, ""] if section else []


def analyze(folder: str | Path) -> list[Path]:
    """`evora analyze`: a run folder's plots and report, or a sweep folder's."""
    if is_sweep(folder):
        return write_sweep_report(folder)
    plots = write_plots(folder)
    return [*plots, write_report(folder, plots)]
