"""`evora serve <run>` (evora/serve.py) on vLLM's CPU build: the real OpenAI-compatible server with the
run's base model and adapters by name, asked through the OpenAI client for the run's held-out
prompts, answers with exactly the run's own held-out completions of the best adapter and of the
base model (eval/best_vs_base.json)."""

from __future__ import annotations

import json
import subprocess

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from conftest import ES_RUN, cli_run, evora_cmd, free_port, started
from evora.distributed.worker_spec import resolve_task
from evora.models import locate_model
from evora.plan.overlay import saved_run_config
from evora.tasks.prompts import PromptRenderer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("es-run")]
PROMPTS = 12


def test_the_server_answers_with_the_runs_own_held_out_completions(tmp_path):
    run_dir, _ = cli_run(*ES_RUN)
    printed = subprocess.run(evora_cmd("serve", str(run_dir), "--print"), capture_output=True, text=True, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "-m vllm.entrypoints.openai.api_server" in printed.stdout and "--lora-modules" in printed.stdout

    run = saved_run_config(run_dir)
    task, splits = resolve_task(run.task, run.seed)
    tokenizer = AutoTokenizer.from_pretrained(locate_model(run.model.path).path)
    renderer = PromptRenderer(tokenizer, run.task.prompt_format, task.plain_template, run.task.system_prompt)
    prompts = [renderer.ids(example) for example in splits.heldout[:PROMPTS]]
    report = json.loads((run_dir / "eval" / "best_vs_base.json").read_text())
    rows = sorted((row for group in report["counts"] for row in report[group]), key=lambda row: row["index"])[:PROMPTS]

    port = free_port()
    server = subprocess.Popen(
        evora_cmd("serve", str(run_dir), "--port", str(port)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log: list[str] = []
        assert started(server, log), "".join(log)[-4000:]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        assert {m.id for m in client.models.list()} == {"base", "best", "mean"}
        for model, column in (("best", "adapter"), ("base", "base")):  # one adapter a request
            answer = client.completions.create(
                model=model, prompt=prompts, max_tokens=run.task.max_tokens, temperature=0
            )
            texts = [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)]
            assert texts == [row[column] for row in rows], model
    finally:
        server.terminate()
        server.wait(timeout=60)
