"""EleutherAI's lm-evaluation-harness on a run's export against its base model (`evora eval
adapter=<...> benchmarks=[gsm8k,arc_easy,...]`): lm-eval's own tasks, prompts and metrics, through
its vLLM backend (the adapter as vLLM's LoRA) under engine=vllm, and its Hugging Face backend (the
adapter through PEFT) under engine=hf, with the run's model, dtype, context length and seed.

A table per task and metric: the base model, the adapter (or a whole model folder, EGGROLL's
`model/`, or a routing.json's default member), their difference, and the difference's standard
error paired over the same documents (lm-eval's standard error of a mean, of the per-document
differences; lm-eval reports none, and the two evaluations are not independent). lm-eval's standard
options pass through (`LmEvalOptions`: limit, num_fewshot, apply_chat_template, log_samples).
Written to `benchmarks.md` / `.json`. Relative data files of your own task YAMLs
(`benchmarks_path`) are read from that folder, as task=lm_eval reads them. lm-eval is the optional
extra `.[eval]`, imported only here."""

from __future__ import annotations

import gc
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evora.config.schema import VLLM_LORA_RANKS, RunConfig
from evora.distributed.portfolio import read_routing
from evora.engines.registry import get_engine
from evora.engines.vllm_patches import install_cpu_distribution_name
from evora.errors import ConfigError
from evora.lora.peft_io import CONFIG_FILE as ADAPTER_CONFIG
from evora.lora.peft_io import read_adapter_config
from evora.models import locate_model
from evora.tasks.builtin.lm_eval_task import reading_from

RESULT_FIELDS = ("name", "alias", "sample_len", "samples")  # lm-eval's per-task keys that are no metric


@dataclass(frozen=True)
class LmEvalOptions:
    """lm-eval's standard options, as `evora eval ... benchmarks=[...]` takes them."""

    limit: int | None = None  # at most this many documents per task
    num_fewshot: int | None = None  # examples before each document (None: each task's own)
    apply_chat_template: bool = False  # the model's chat template around each prompt
    log_samples: bool = False  # each document's prompt, answers and metrics in samples_<subject>.jsonl


@dataclass(frozen=True)
class Evaluation:
    """One simple_evaluate: task -> "metric,filter" -> (value, standard error or None), the same
    keys' per-document values (doc id -> value), and lm-eval's samples by task."""

    metrics: dict[str, dict[str, tuple[float, float | None]]]
    documents: dict[str, dict[str, dict[int, float]]]
    samples: dict[str, list[dict[str, Any]]]


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


def per_document(samples: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, dict[int, float]]]:
    """task -> "metric,filter" -> doc id -> the document's value, from simple_evaluate's samples."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    for task, rows in samples.items():
        for row in rows:
            for metric in row["metrics"]:
                if isinstance(row[metric], (int, float)):
                    table.setdefault(task, {}).setdefault(f"{metric},{row['filter']}", {})[row["doc_id"]] = row[metric]
    return table


def paired_stderr(base: dict[int, float], other: dict[int, float], means: tuple[float, float]) -> float | None:
    """The standard error of the difference over the same documents: lm-eval's `mean_stderr` of
    the per-document differences. None unless both evaluations scored the same documents and each
    metric is the mean of its documents' values (lm-eval aggregates some otherwise: bleu, perplexity)."""
    if base.keys() != other.keys() or len(base) < 2:
        return None
    docs = sorted(base)
    for values, mean in ((base, means[0]), (other, means[1])):
        if not math.isclose(statistics.fmean(float(values[d]) for d in docs), mean, rel_tol=1e-9, abs_tol=1e-12):
            return None
    differences = [float(other[d]) - float(base[d]) for d in docs]
    return statistics.stdev(differences) / math.sqrt(len(docs))


def evaluate(
    run: RunConfig, subject: Subject, tasks: list[str], include_path: str | None, options: LmEvalOptions
) -> Evaluation:
    """One lm-eval evaluation of `subject` (simple_evaluate), with the run's seed; its samples are
    kept for the paired standard error."""
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ConfigError("benchmarks=...: needs lm-evaluation-harness: pip install -e '.[eval]'") from None
    backend = get_engine(run.engine.name).lm_eval_backend
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
            limit=options.limit,
            num_fewshot=options.num_fewshot,
            apply_chat_template=options.apply_chat_template,
            log_samples=True,
            **seeds,
        )
    gc.collect()  # the backend's model (a vLLM engine) goes before the next one starts
    samples = results.get("samples", {})
    return Evaluation(metrics_of(results), per_document(samples), samples)


def compare(base: Evaluation, other: Evaluation) -> list[dict[str, Any]]:
    rows = []
    for task, metrics in base.metrics.items():
        for key, (value, stderr) in metrics.items():
            theirs, their_stderr = other.metrics[task][key]
            documents = (base.documents.get(task, {}).get(key, {}), other.documents.get(task, {}).get(key, {}))
            difference_se = paired_stderr(*documents, (value, theirs))
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
        + (f", {report['num_fewshot']}-shot" if report["num_fewshot"] is not None else "")
        + (", chat template" if report["apply_chat_template"] else "")
        + ". ± is the standard error; the difference's is paired over the same documents.",
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


def write_samples(path: Path, samples: dict[str, list[dict[str, Any]]]) -> None:
    """lm-eval's samples, a JSON line each with its task (log_samples=true)."""
    with path.open("w") as file:
        for task, rows in samples.items():
            for row in rows:
                file.write(json.dumps({"task": task, **row}, default=str) + "\n")


def run_benchmarks(
    run: RunConfig,
    export: str,
    tasks: list[str],
    out: Path,
    include_path: str | None = None,
    options: LmEvalOptions = LmEvalOptions(),
) -> dict[str, Any]:
    """Both evaluations, the table, and benchmarks.md / .json in `out` (with log_samples, each
    subject's samples_<label>.jsonl)."""
    from lm_eval import __version__ as lm_eval_version

    folder, name = export_folder(export)  # a routing.json read once
    base, other = subjects(run, folder)
    evaluations = [evaluate(run, s, tasks, include_path, options) for s in (base, other)]
    rows = compare(*evaluations)
    report: dict[str, Any] = {
        "export": name,
        "base_model": run.model.path,
        "backend": get_engine(run.engine.name).lm_eval_backend,
        "tasks": tasks,
    }
    report |= {"seed": run.seed, "limit": options.limit, "num_fewshot": options.num_fewshot}
    report |= {"apply_chat_template": options.apply_chat_template, "lm_eval_version": lm_eval_version, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    if options.log_samples:
        for subject, evaluation in zip((base, other), evaluations):
            write_samples(out / f"samples_{subject.label}.jsonl", evaluation.samples)
    (out / "benchmarks.json").write_text(json.dumps(report, indent=2))
    (out / "benchmarks.md").write_text(markdown(report))
    report["paths"] = [str(out / "benchmarks.md"), str(out / "benchmarks.json")]
    return report


def benchmark_environment(run: RunConfig) -> dict[str, str]:
    """What the process that runs `benchmark` sets first: lm-eval's vLLM engine runs in it, and gets
    the environment evora's engines get."""
    from evora.distributed.worker_spec import engine_spec

    return get_engine(run.engine.name).environment(engine_spec(run, locate_model(run.model.path).path))
