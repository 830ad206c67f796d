"""`evora eval`: one adapter (or the base model) on a split, optionally against the base
model, on a worker pool of its own; the same comparison every run's finish writes. A run's
routing.json is evaluated as the routed portfolio it describes (each example by its family's
member), with the functions the finish of a portfolio run uses (`distributed/portfolio.py`)."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from evora.analysis.comparison import build_report, write_reports
from evora.distributed.evaluate import SplitOutcome, evaluate_split
from evora.distributed.finish import report_against_base
from evora.distributed.pool import WorkerPool
from evora.distributed.portfolio import RoutingFile, evaluate_routed, family_metrics, metrics_of, read_routing
from evora.distributed.ray_session import init_ray
from evora.distributed.worker_spec import worker_spec
from evora.engines.adapter_store import sweep_run_scratch
from evora.errors import ConfigError
from evora.lora.layout import Adaptable, AdapterLayout
from evora.lora.peft_io import layout_of_adapter, load_adapter_tensors
from evora.plan.run_plan import RunPlan
from evora.strategies.protocol import BASE
from evora.tasks.base import Example
from evora.tasks.decoding import eval_decoding
from evora.tracking.compute import Spend
from evora.tracking.run_dir import run_tag


@contextmanager
def _worker_pool(plan: RunPlan, layout: AdapterLayout, out_dir: str) -> Iterator[WorkerPool]:
    """Ray and an evaluation-only worker pool for `layout`; shut down (scratch swept) on the way out."""
    run, tag = plan.run, run_tag(out_dir)
    init_ray(run)
    resolved = (plan.task, plan.splits)
    spec = worker_spec(
        run, plan.model_path, layout, tag, with_strategy=False, max_lora_rank=layout.rank, resolved=resolved
    )
    pool = WorkerPool.start(spec, run.hardware)
    try:
        yield pool
    finally:
        pool.shutdown()
        sweep_run_scratch(run.engine.adapter_dir, tag)


def run_evaluation(plan: RunPlan, adapter: str | None, compare: bool, split: str, out_dir: str) -> dict[str, Any]:
    """Writes <out_dir>/{compare,eval}.{md,json}; returns the report."""
    run, layout, theta = plan.run, plan.layout, None
    if adapter is not None:
        layout, theta = layout_of_adapter(adapter, plan.modules.adaptable), load_adapter_tensors(adapter)
    examples, k = plan.splits.get(split), eval_decoding(run.task).k
    with _worker_pool(plan, layout, out_dir) as pool:
        return report_against_base(
            lambda theta_, layout_, ops: evaluate_split(
                pool, theta_, ops, split, len(examples), keep_texts=True, perplexity=True, k=k
            ),
            theta,
            None,
            examples,
            task=run.task.name,
            split=split,
            adapter_name=adapter or "base model",
            out_dir=Path(out_dir),
            stem="compare" if compare else "eval",
            with_base=compare,
        )


def members_layout(portfolio: RoutingFile, shapes: dict[str, Adaptable]) -> AdapterLayout:
    """The one layout every member has (one worker pool serves them all); ConfigError naming the
    routing file otherwise."""
    layouts = {}
    for member, folder in zip(portfolio.ids, portfolio.folders):
        try:
            layouts[member] = layout_of_adapter(folder, shapes, key=f"member {member}")
        except ConfigError as error:
            raise ConfigError(f'adapter="{portfolio.path}": {error}') from None
    first, layout = portfolio.ids[0], layouts[portfolio.ids[0]]
    for member, other in layouts.items():  # base_model is a name only: the run's model is the one served
        if dataclasses.replace(other, base_model="") != dataclasses.replace(layout, base_model=""):
            raise ConfigError(
                f'adapter="{portfolio.path}": members {first} and {member} have different layouts '
                f"(rank {layout.rank} vs {other.rank}, modules {list(layout.target_modules)} vs "
                f"{list(other.target_modules)}, layers {layout.layers} vs {other.layers}); a portfolio has one"
            )
    return layout


def run_portfolio_evaluation(
    plan: RunPlan, routing_file: str, compare: bool, split: str, out_dir: str
) -> dict[str, Any]:
    """A routed portfolio (a run's routing.json) on `split`, and with `compare` the base model
    beside it; writes <out_dir>/{compare,eval}.{md,json} (with a `portfolio` section: routing,
    the member serving each family, per-family metrics, the single best member); returns the
    report. Bad input stops before Ray starts."""
    run, portfolio = plan.run, read_routing(routing_file)
    layout = members_layout(portfolio, plan.modules.adaptable)
    members = [load_adapter_tensors(folder) for folder in portfolio.folders]
    examples = plan.splits.get(split)
    with _worker_pool(plan, layout, out_dir) as pool:
        matrices, rows = evaluate_routed(
            pool, list(portfolio.ids), members, portfolio.routing, split, examples,
            max_loras=run.engine.max_loras, generation=0, spend=Spend(), keep_texts=True,
        )  # fmt: skip
        base = evaluate_split(pool, None, [BASE], split, len(examples), keep_texts=True)[BASE] if compare else None
    report = build_report(
        examples,
        routed_outcome(matrices, rows),
        base,
        task=run.task.name,
        split=split,
        adapter_name=str(portfolio.path),
    )
    report["portfolio"] = portfolio_section(portfolio, matrices, rows, examples, base)
    md_path, json_path = write_reports(report, out_dir, "compare" if compare else "eval")
    md_path.write_text(with_section(md_path.read_text(), portfolio_markdown(report["portfolio"])))
    report["paths"] = [str(md_path), str(json_path)]
    return report


def routed_outcome(matrices: dict[str, np.ndarray], rows: list[int]) -> SplitOutcome:
    """The portfolio as one adapter: each example's outcome from the member routed to it."""
    columns = np.arange(len(rows))
    return SplitOutcome(
        rewards=matrices["rewards"][rows, columns],
        correct=matrices["correct"][rows, columns],
        tokens=matrices["tokens"][rows, columns],
        perplexity=None,
        texts=[str(t) for t in matrices["texts"][rows, columns]],
    )


def portfolio_section(
    portfolio: RoutingFile,
    matrices: dict[str, np.ndarray],
    rows: list[int],
    examples: Sequence[Example],
    base: SplitOutcome | None,
) -> dict[str, Any]:
    """What the report adds for a portfolio: its metrics as the run's summary has them
    (`details.portfolio`, `single_best`), the routing, and per family the member serving it."""
    default = portfolio.routing["default"]
    families: dict[str, dict[str, Any]] = family_metrics(matrices, rows, examples)
    for family, metrics in families.items():
        metrics["member"] = portfolio.routing.get(family, default)
        if base is not None:
            columns = [j for j, e in enumerate(examples) if e.family == family]
            metrics["base_reward"] = float(base.rewards[columns].mean())
            metrics["base_accuracy"] = float(base.correct[columns].mean())
    single = portfolio.ids.index(default)
    return {
        "routing_file": str(portfolio.path),
        "routing": portfolio.routing,
        "members": list(portfolio.ids),
        **metrics_of(matrices, rows),
        "single_best": {"id": default, **metrics_of(matrices, [single] * len(rows))},
        "families": families,
    }


def with_section(markdown: str, section: str) -> str:
    """The section right after the report's first table (the headline metrics), before the
    per-example lists, which can run long."""
    lines = markdown.splitlines()
    table = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    end = next((i for i in range(table, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join([*lines[:end], *section.rstrip("\n").splitlines(), *lines[end:]]) + "\n"


def portfolio_markdown(section: dict[str, Any]) -> str:
    single = section["single_best"]
    with_base = any("base_reward" in f for f in section["families"].values())
    lines = [
        "",
        "## Routed portfolio",
        "",
        f"`{section['routing_file']}`: {len(section['members'])} members ({', '.join(section['members'])}); "
        f"families the map does not name go to {single['id']}.",
        "",
        f"Portfolio reward {section['reward']:.4f}, accuracy {section['accuracy']:.4f}, tokens "
        f"{section['tokens']:.2f}; the single best member alone ({single['id']}): reward {single['reward']:.4f}, "
        f"accuracy {single['accuracy']:.4f}.",
        "",
        "| family | member | examples | reward | accuracy | tokens |" + (" base reward |" if with_base else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if with_base else ""),
    ]
    for family, m in section["families"].items():
        base = f" {m['base_reward']:.4f} |" if with_base else ""
        lines.append(
            f"| {family or '(none)'} | {m['member']} | {m['examples']} | {m['reward']:.4f} | {m['accuracy']:.4f} "
            f"| {m['tokens']:.2f} |{base}"
        )
    return "\n".join(lines) + "\n"
