"""`evora eval`: an adapter, a routed portfolio or the base model on a split, or lm-eval benchmarks."""

from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from evora.commands.exits import die
from evora.errors import ConfigError, EvoraError
from evora.plan.compose import parse_overrides
from evora.plan.jobs import job_plan
from evora.plan.store import writable_schema


def option(default: Any, text: str) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class EvalOptions:
    """`evora eval`'s own keys; every other key=value is the run config's. Both are Hydra
    overrides, parsed by Hydra's grammar as a run's are (lists as [a,b], booleans, numbers)."""

    adapter: Optional[str] = option(None, "a PEFT adapter folder, a run's routing.json (its routed portfolio), or base")
    compare: bool = option(False, "true: the base model too, example by example")
    split: str = option("heldout", "heldout | selection | train")
    out: Optional[str] = option(None, "the report folder (default: <run>/eval/<adapter>, or <out_dir>/<time>_eval)")
    benchmarks: Optional[list[str]] = option(
        None, "lm-evaluation-harness tasks, e.g. [gsm8k,arc_easy]: the export against the base model"
    )
    benchmarks_path: Optional[str] = option(None, "a folder of your own lm-eval task YAMLs (lm-eval's include_path)")
    limit: Optional[int] = option(None, "benchmarks: at most this many documents per task")
    num_fewshot: Optional[int] = option(None, "benchmarks: examples before each document (default: each task's own)")
    apply_chat_template: bool = option(False, "benchmarks: true: the model's chat template around each prompt")
    log_samples: bool = option(
        False, "benchmarks: true: each document's prompt, answers and metrics in samples_*.jsonl"
    )


EVAL_OPTIONS = tuple(f.name for f in dataclasses.fields(EvalOptions))
SPLITS = ("heldout", "selection", "train")
COUNT, FLAG = "a count (0, 1, 2, ...)", "allowed: true, false"
RULES = {"compare": FLAG, "apply_chat_template": FLAG, "log_samples": FLAG, "limit": COUNT, "num_fewshot": COUNT}
RULES |= {"benchmarks": "tasks as [a,b]"}  # what a value that does not fit its key's type is told


def eval_options(argv: list[str]) -> tuple[EvalOptions, list[str]]:
    """`evora eval`'s options, typed, and the config overrides among `argv`; a bad value is one
    line naming its key."""
    values: dict[str, Any] = {}
    overrides = []
    for text, override in zip(argv, parse_overrides(argv)):
        key = override.key_or_group
        if key not in EVAL_OPTIONS:
            overrides.append(text)
            continue
        if override.is_sweep_override():
            raise ConfigError(f"malformed override '{text}': a sweep is not allowed here")
        value = override.value()
        values[key] = [value] if key == "benchmarks" and isinstance(value, str) else value
    node = writable_schema(EvalOptions)
    for key, value in values.items():
        try:
            OmegaConf.update(node, key, value, merge=False)
        except ValidationError:
            raise ConfigError(f"{key}={value}: {RULES.get(key, 'a text')}") from None
    options: EvalOptions = OmegaConf.to_object(node)  # type: ignore[assignment]  # a structured EvalOptions
    check_options(options)
    return options, overrides


def check_options(options: EvalOptions) -> None:
    if options.adapter is None:
        raise ConfigError("adapter: required, e.g. evora eval adapter=runs/<run>/adapters/best (or adapter=base)")
    if options.split not in SPLITS:
        raise ConfigError(f"split={options.split}: allowed: {', '.join(SPLITS)}")
    for key in ("limit", "num_fewshot"):
        count = vars(options)[key]
        if count is not None and count < 0:
            raise ConfigError(f"{key}={count}: {COUNT}")
    if options.benchmarks is not None and not options.benchmarks:
        raise ConfigError(f"benchmarks=[]: {RULES['benchmarks']}")


def _owner_run(adapter: str | None) -> Path | None:
    """The run folder (with its config.yaml) an adapter (<run>/adapters/<name>) or a routing
    file (<run>/routing.json) comes from; None elsewhere."""
    if adapter is None:
        return None
    path = Path(adapter)
    if path.name.endswith(".json"):
        owner = path.parent
    elif path.parent.name == "adapters" and len(path.parents) > 1:
        owner = path.parents[1]
    else:
        return None
    return owner if (owner / "config.yaml").is_file() else None


def main(argv: list[str]) -> None:
    """`evora eval adapter=<dir|routing.json|base> [compare=true] [split=heldout] [out=<dir>] [config overrides]`.

    An adapter inside a run folder (<run>/adapters/<name>), or a run's routing.json, is
    evaluated with that run's config (model, task, seed), overrides applied on top; elsewhere
    with the defaults. A routing.json is evaluated as its routed portfolio. benchmarks=[a,b]: lm-eval's tasks."""
    from datetime import datetime

    if set(argv[:1]) & {"--help", "-h"}:
        return print(usage())
    from evora.plan.compose import compose_run
    from evora.plan.overlay import overlay, saved_run_config

    try:
        options, overrides = eval_options(argv)
        adapter = None if options.adapter == "base" else str(Path(str(options.adapter)).resolve())
        routed = adapter is not None and adapter.endswith(".json")
        owner = _owner_run(adapter)
        run = overlay(saved_run_config(owner), overrides) if owner else compose_run(overrides)
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        name = "portfolio" if routed else Path(adapter or "base").name
        out = options.out or str(owner / "eval" / name if owner else Path(run.tracking.out_dir) / f"{stamp}_eval")
        from evora.distributed.eval_job import run_evaluation, run_portfolio_evaluation

        if options.benchmarks is not None:
            return _benchmarks(run, adapter, options, Path(out))
        plan = job_plan(run, overrides)
        if routed:
            assert adapter is not None
            report = run_portfolio_evaluation(plan, adapter, options.compare, options.split, out)
        else:
            report = run_evaluation(plan, adapter, options.compare, options.split, out)
    except EvoraError as error:
        die(error)
    _print_eval(report)


def usage() -> str:
    lines = [
        inspect.cleandoc(str(main.__doc__)),
        "",
        "options (the rest: the run config's keys, e.g. task.eval_size=64):",
    ]
    return "\n".join(lines + [f"  {f.name:<20} {f.metadata['help']}" for f in dataclasses.fields(EvalOptions)])


def _benchmarks(run: Any, adapter: str | None, options: EvalOptions, out: Path) -> None:
    from evora.jobs.benchmarks import LmEvalOptions, benchmark_environment, run_benchmarks

    if adapter is None:
        raise ConfigError("benchmarks=...: adapter= names a PEFT adapter, a model folder or a routing.json")
    os.environ.update(benchmark_environment(run))
    lm_eval = LmEvalOptions(options.limit, options.num_fewshot, options.apply_chat_template, options.log_samples)
    assert options.benchmarks is not None
    report = run_benchmarks(run, adapter, list(options.benchmarks), out, options.benchmarks_path, lm_eval)
    print(Path(report["paths"][0]).read_text(), end="")


def _print_eval(report: dict[str, Any]) -> None:
    adapter_metrics = report["adapter_metrics"]
    if "base_metrics" in report:
        base, counts = report["base_metrics"], report["counts"]
        print(
            f"{report['split']} accuracy: base model {base['accuracy']:.3f} -> "
            f"adapter {adapter_metrics['accuracy']:.3f}"
            f" ({counts['improvements']} improvements, {counts['regressions']} regressions, "
            f"{counts['both_wrong']} both wrong, {counts['failed']} failed rewards, of {report['examples']})"
        )
    else:
        print(f"{report['split']}: " + ", ".join(f"{k} {v:.3f}" for k, v in adapter_metrics.items()))
    if "portfolio" in report:  # a routed portfolio: who served which family, and how well
        section = report["portfolio"]
        served = ", ".join(
            f"{f or '(none)'} -> {m['member']} {m['reward']:.3f}" for f, m in section["families"].items()
        )
        single = section["single_best"]
        print(
            f"routed portfolio reward {section['reward']:.3f} ({served}); "
            f"single best {single['id']} {single['reward']:.3f}"
        )
    print("reports: " + ", ".join(report["paths"]))
