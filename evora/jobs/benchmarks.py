"""EleutherAI's lm-evaluation-harness on a run's export against its base model (`evora eval
adapter=<...> benchmarks=[gsm8k,arc_easy,...]`): lm-eval's own tasks, prompts and metrics, through
its vLLM backend (the adapter as vLLM's LoRA) under engine=vllm, and its Hugging Face backend (the
adapter through PEFT) under engine=hf, with the run's model, dtype, context length and seed.

A table per task and metric: the base model, the adapter (or a whole model folder, EGGROLL's
`model/`, or a routing.json's default member), their difference, and the difference's standard
error from lm-eval's own standard errors of the two (as if independent: lm-eval reports no paired
one). Written to `benchmarks.md` / `.json`. Relative data files of your own task YAMLs
(`benchmarks_path`) are read from that folder, as task=lm_eval reads them. lm-eval is the optional
extra `.[eval]`, imported only here."""

from __future__ import annotations

import gc
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evora.config.schema import VLLM_LORA_RANKS, RunConfig
from evora.distributed.portfolio import read_routing
from evora.engines.vllm_patches import install_cpu_distribution_name
from evora.errors import ConfigError
from evora.lora.peft_io import CONFIG_FILE as ADAPTER_CONFIG
from evora.lora.peft_io import read_adapter_config
from evora.models import locate_model
from evora.tasks.lm_eval_task import reading_from

BACKENDS = {"vllm": "vllm", "hf": "hf"}  # evora engine -> lm-eval model type
RESULT_FIELDS = ("name", "alias", "sample_len", "samples")  # lm-eval's per-task keys that are no metric


@dataclass(frozen=True)
class Subject:
    """What one lm-eval evaluation loads: a model folder or hub id, with a PEFT adapter or none."""

    label: str
    pretrained: str
    adapter: str | None = None


def export_folder(export: str) -> tuple[Path, str]:
    """The folder lm-eval loads for `export` and the table's name for it: itself, or a
    routing.json's default member (lm-eval's documents carry no evora family to route by; the
    default is the portfolio's single best member)."""
    if not export.endswith(".json"):
        return Path(export), export
    portfolio = read_routing(export)
    default = portfolio.routing["default"]
    return portfolio.folders[portfolio.ids.index(default)], f"{export} (default member {default})"


def subjects(run: RunConfig, folder: Path) -> tuple[Subject, Subject]:
    """(the base model, the export): a PEFT adapter folder or a whole model folder (a routed
    portfolio's default member: `export_folder`)."""
    base = locate_model(run.model.path).path
    if (folder / ADAPTER_CONFIG).is_file():
        return Subject("base", base), Subject("adapter", base, str(folder.resolve()))
    if (folder / "config.json").is_file():
        return Subject("base", base), Subject("model", str(folder.resolve()))
    raise ConfigError(f"adapter={folder}: neither a PEFT adapter folder nor a model folder (for benchmarks)")


def model_args(run: RunConfig, backend: str, subject: Subject) -> dict[str, Any]:
    """lm-eval's model_args for `subject` under the run's settings."""
    model, hardware = run.model, run.hardware
    common: dict[str, Any] = {"pretrained": subject.pretrained, "dtype": model.dtype}
    common |= {"trust_remote_code": model.trust_remote_code}
    common |= {"revision": model.revision} if model.revision and subject.label != "model" else {}  # the hub's base
    common |= {"tokenizer": model.tokenizer} if model.tokenizer else {}
    if backend == "hf":
        device = "cuda" if hardware.gpus_per_worker > 0 else "cpu"
        return {**common, "device": device, **({"peft": subject.adapter} if subject.adapter else {})}
    args = {**common, "max_model_len": model.max_model_len, "seed": run.seed}
    args |= {"tensor_parallel_size": hardware.tensor_parallel_size, "enable_prefix_caching": False}
    args |= {"gpu_memory_utilization": hardware.gpu_memory_utilization}
    if hardware.gpus_per_worker == 0:
        args["kv_cache_memory_bytes"] = hardware.kv_cache_gib * 2**30
    if subject.adapter:
        rank = int(read_adapter_config(subject.adapter)["r"])
        args |= {"lora_local_path": subject.adapter, "max_lora_rank": min(r for r in VLLM_LORA_RANKS if r >= rank)}
    return args


def metrics_of(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float | None]]]:
    """task -> "metric,filter" -> (value, standard error or None) from simple_evaluate's results."""
    table: dict[str, dict[str, tuple[float, float | None]]] = {}
    for task, fields in results["results"].items():
        for key, value in fields.items():
            if key in RESULT_FIELDS or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            metric, _, filtering = key.partition(",")
            stderr = fields.get(f"{metric}_stderr,{filtering}")
            table.setdefault(task, {})[key] = (
                float(value),
                float(stderr) if isinstance(stderr, (int, float)) else None,
            )
    return table


def evaluate(run: RunConfig, subject: Subject, tasks: list[str], include_path: str | None, limit: int | None) -> dict:
    """One lm-eval evaluation of `subject` (simple_evaluate), with the run's seed."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError("benchmarks=...: needs lm-evaluation-harness: pip install -e '.[eval]'") from None
    backend = BACKENDS[run.engine.name]
    if backend == "vllm":
        install_cpu_distribution_name()  # lm-eval's vLLM backend asks for the `vllm` distribution's version
    include_path = str(Path(include_path).resolve()) if include_path else None
    manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ConfigError(f"benchmarks={','.join(unknown)}: no such lm-eval task (see `lm-eval ls tasks`)")
    seeds = {k: run.seed for k in ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")}
    with reading_from(include_path):  # your tasks' relative data files, as task=lm_eval reads them
        results = lm_eval.simple_evaluate(
            model=backend,
            model_args=model_args(run, backend, subject),
            tasks=tasks,
            task_manager=manager,
            limit=limit,
            log_samples=False,
            **seeds,
        )
    gc.collect()  # the backend's model (a vLLM engine) goes before the next one starts
    return metrics_of(results)


def compare(base: dict, other: dict) -> list[dict[str, Any]]:
    rows = []
    for task, metrics in base.items():
        for key, (value, stderr) in metrics.items():
            theirs, their_stderr = other[task][key]
            difference_se = (
                math.hypot(stderr, their_stderr) if stderr is not None and their_stderr is not None else None
            )
            rows.append(
                {"task": task, "metric": key, "base": value, "base_stderr": stderr, "export": theirs}
                | {"export_stderr": their_stderr, "difference": theirs - value, "difference_stderr": difference_se}
            )
    return rows


def markdown(report: dict[str, Any]) -> str:
    def se(value: float | None) -> str:
        return "" if value is None else f" ± {value:.4f}"

    lines = [
        f"# Benchmarks: {report['export']} against {report['base_model']}",
        "",
        f"lm-evaluation-harness {report['lm_eval_version']}, backend `{report['backend']}`, seed {report['seed']}"
        + (f", limit {report['limit']}" if report["limit"] else "")
        + ". ± is the standard error.",
        "",
        "| task | metric | base model | export | difference |",
        "|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['task']} | {r['metric']} | {r['base']:.4f}{se(r['base_stderr'])} | {r['export']:.4f}"
            f"{se(r['export_stderr'])} | {r['difference']:+.4f}{se(r['difference_stderr'])} |"
        )
    return "\n".join(lines) + "\n"


def run_benchmarks(
    run: RunConfig, export: str, tasks: list[str], out: Path, include_path: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """Both evaluations, the table, and benchmarks.md / .json in `out`."""
    from lm_eval import __version__ as lm_eval_version

    folder, name = export_folder(export)  # a routing.json read once
    base, other = subjects(run, folder)
    rows = compare(*(evaluate(run, s, tasks, include_path, limit) for s in (base, other)))
    report: dict[str, Any] = {
        "export": name,
        "base_model": run.model.path,
        "backend": BACKENDS[run.engine.name],
        "tasks": tasks,
    }
    report |= {"seed": run.seed, "limit": limit, "lm_eval_version": lm_eval_version, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(report, indent=2))
    (out / "benchmarks.md").write_text(markdown(report))
    report["paths"] = [str(out / "benchmarks.md"), str(out / "benchmarks.json")]
    return report
