"""<run>/report.md: what was run, what came out, the curves, and findings computed from
the data, so that a run folder explains itself without a notebook. Also a short
sweep report for a multirun folder. No Ray, vLLM or W&B here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from evora.analysis.compare import conditions_lines, read_row, sweep_jobs
from evora.analysis.ecology_plots import TITLES as ECOLOGY_TITLES
from evora.analysis.plots import (
    HYPERPARAMETERS,
    PHASES,
    PLOTS_DIR,
    SWEEP_SUMMARY,
    is_pbt,
    read_jsonl,
    sweep_groups,
    write_plots,
    write_sweep_plot,
)
from evora.errors import ConfigError
from evora.strategies import get_strategy
from evora.tracking.metrics import read_metrics, read_trials
from evora.tracking.run_dir import CONFIG_FILE, LINEAGE_FILE
from evora.tracking.summary import headline, read_summary

REPORT = "report.md"
PLOT_TITLES = {
    "reward": "Reward / fitness over generations",
    "timing": "Time per generation",
    "lineage": "Family tree",
    "mutations": "Mutation effectiveness",
    "hyperparameters": "Mean fitness by rank and learning rate",
    "survival": "Hyperparameter survival",
    **ECOLOGY_TITLES,
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
    try:
        return get_strategy(name).report_keys if name else ()
    except ConfigError:  # a user's strategy that is not importable here: the report still renders
        return ()


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


def _ecology(summary: dict[str, Any]) -> list[str]:
    """An ecology run's totals, its routed portfolio against the single best organelle and the base
    model on held-out, and the routing map; [] for any other strategy."""
    details = summary.get("details") or {}
    if "condition" not in details:
        return []
    energy = details.get("energy") or {}
    return [
        "## Ecology",
        "",
        f"Condition `{details['condition']}`: {_fmt(details.get('episodes'))} episodes, mean ROI "
        f"{_fmt(details.get('mean_roi'))} per episode; births {_fmt(details.get('births'))} "
        f"(merges {_fmt(details.get('merges'))}), retirements {_fmt(details.get('retirements'))}, "
        f"{_fmt(details.get('population'))} organelles alive at the end; "
        f"QD coverage {_fmt(details.get('qd_coverage'))}.",
        f"Energy: {_fmt(energy.get('start'))} at the start, {_fmt(energy.get('end'))} at the end "
        f"({_fmt(energy.get('earned'))} earned, {_fmt(energy.get('spent'))} spent, "
        f"{_fmt(energy.get('retired'))} left with the retired).",
        "",
        *_ecology_heldout(summary, details),
        "",
        _routing_line(details.get("routing") or {}),
        "",
    ]


def _ecology_heldout(summary: dict[str, Any], details: dict[str, Any]) -> list[str]:
    single = details.get("single_best") or {}
    rows = (
        ("routed portfolio", details.get("portfolio") or {}),
        (f"single best organelle (`{single.get('id', '-')}`)", single),
        ("base model", summary.get("base") or {}),
    )
    lines = ["| held-out | reward | accuracy | tokens per episode |", "| --- | --- | --- | --- |"]
    return lines + [
        f"| {name} | {_fmt(m.get('reward'))} | {_fmt(m.get('accuracy'))} | {_fmt(m.get('tokens'))} |"
        for name, m in rows
    ]


def _routing_line(routing: dict[str, Any]) -> str:
    if not routing:
        return "No routing map in the summary."
    pairs = ", ".join(f"`{family}` -> `{member}`" for family, member in routing.items())
    # "default" serves families the selection split never showed (e.g. held-out-only families).
    return f"Routing map (family -> organelle, `routing.json`; `default` serves unseen families): {pairs}."


def _curves(plots: list[Path]) -> list[str]:
    lines = ["## Curves", ""]
    for path in plots:
        lines += [f"### {PLOT_TITLES.get(path.stem, path.stem)}", "", f"![{path.stem}]({PLOTS_DIR}/{path.name})", ""]
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


def findings(metrics: list[dict[str, Any]], summary: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
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
    found += _heldout_peak(metrics) + _slowest_phase(metrics) + _surviving_values(trials)
    return found


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
    slowest = max(totals, key=totals.get)
    return [
        f"`{slowest.removeprefix('seconds_')}` takes {100 * totals[slowest] / total:.0f}% of the "
        f"measured generation time."
    ]


def _surviving_values(trials: list[dict[str, Any]]) -> list[str]:
    if not trials:
        return []
    last = max(t["generation"] for t in trials)
    held = {k: sorted({str(t[k]) for t in trials if t["generation"] == last and k in t}) for k in HYPERPARAMETERS}
    return [
        "Hyperparameter values in the last generation: "
        + "; ".join(f"{k} {', '.join(v)}" for k, v in held.items() if v)
        + "."
    ]


def write_report(run_dir: str | Path, plots: list[Path] | None = None) -> Path:
    run = Path(run_dir)
    config_path = run / CONFIG_FILE
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    summary, comparison = read_summary(run) or {}, _json(run / "eval" / "best_vs_base.json")
    metrics, trials = read_metrics(run), read_trials(run)
    plots = write_plots(run) if plots is None else plots
    lines = [f"# Run report: {run.name}", ""]
    lines += _configuration(config) + _best_variant(run, summary) + _final_metrics(summary) + _ecology(summary)
    lines += ["## Notable findings", ""] + [f"- {f}" for f in findings(metrics, summary, trials)] + [""]
    lines += _curves(plots) + _comparison(comparison)
    if is_pbt(metrics) or (run / LINEAGE_FILE).exists():
        lines += [f"Lineage records: {len(read_jsonl(run / LINEAGE_FILE))} (`{LINEAGE_FILE}`).", ""]
    path = run / REPORT
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
    lines += _sweep_conditions(folder)
    path = folder / REPORT
    path.write_text("\n".join(lines))
    return [plot, path]


def _sweep_conditions(folder: Path) -> list[str]:
    """The ecology conditions table over the sweep's jobs (named by job number); [] without an ecology."""
    rows = [read_row(job.name, job) for job in sweep_jobs(folder)]
    section = conditions_lines(rows)
    return [*section, ""] if section else []


def analyze(folder: str | Path) -> list[Path]:
    """`evora analyze`: a run folder's plots and report, or a sweep folder's."""
    if is_sweep(folder):
        return write_sweep_report(folder)
    plots = write_plots(folder)
    return [*plots, write_report(folder, plots)]
