"""`evora doctor --run [overrides]`: every registered check on this node, each one line as it
finishes, then doctor-report.md and doctor-report.json in the current folder. Exit 0 when none
failed (skipped checks say why), 1 when one did, 2 for bad input (the run's own one-line error)."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

import torch

from evora.config.schema import RunConfig
from evora.selfcheck import engine_checks, memory_check, numerics, ray_run
from evora.selfcheck.checks import CHECKS, FAILED, Check, CheckResult, Node, run_check
from evora.selfcheck.environment import environment, environment_lines

# The modules that register evora's checks, in the report's order; those whose checks run in this
# process (ray_run's start runs of their own), which bench/gpu_check.py runs where Ray is not.
REGISTERED_BY = (numerics, engine_checks, memory_check, ray_run)
IN_PROCESS = (numerics, engine_checks, memory_check)
SIZE, PROMPTS = 256, 4  # the numeric checks' matrix width; prompts per candidate of the engine checks


def node_of(run: RunConfig, overrides: list[str]) -> Node:
    """The node the run would use: its engine and model, on the GPU where the run asks for one."""
    from evora.distributed.worker_spec import engine_spec, vllm_target_modules
    from evora.models import locate_model

    model = locate_model(run.model.path).path
    device = "cuda" if run.hardware.gpus_per_worker > 0 and torch.cuda.is_available() else "cpu"
    layout = engine_checks.candidate_layout(model)
    spec = engine_spec(run, model, max_lora_rank=layout.rank, lora_target_modules=vllm_target_modules(layout))
    return Node(device, SIZE, PROMPTS, run.engine.name, spec, tuple(overrides), run)


def node_for(overrides: list[str]) -> Node:
    """The node of the run `overrides` compose (bad input raises its one-line error)."""
    from evora.plan.compose import compose_run

    return node_of(compose_run(overrides), overrides)  # validated: the checks run what it composes


def in_order(modules: tuple[ModuleType, ...] = REGISTERED_BY) -> list[Check]:
    """The checks `modules` register, module by module; by default evora's, then any other registered."""
    names = [module.__name__ for module in modules]
    ours = [check for name in names for check in CHECKS.values() if check.run.__module__ == name]
    if modules is not REGISTERED_BY:
        return ours
    return ours + [check for check in CHECKS.values() if check.run.__module__ not in names]


def run_checks(node: Node, overrides: list[str], out: Path, checks: list[Check] | None = None) -> int:
    """`checks` (every registered one) on `node`, a line each as it ends; the report in `out`; 1 if
    one failed."""
    env = environment()
    print("\n".join(environment_lines(env)), flush=True)
    print(f"node         {node.device}, engine={node.engine}, model {node.spec.model}\n", flush=True)
    results = []
    for check in checks if checks is not None else in_order():
        results.append(run_check(check, node))
        print(result_line(results[-1]), flush=True)
    paths = write_report(out, env, node, results, overrides)
    failed = [r.name for r in results if r.status == FAILED]
    verdict = f"{len(failed)} failed: {', '.join(failed)}" if failed else "every check that ran passed"
    print(f"\nverdict      {verdict}; report: {', '.join(map(str, paths))}")
    return 1 if failed else 0


def result_line(result: CheckResult) -> str:
    fix = f" (change: {result.fix})" if result.fix else ""
    return f"{result.status:7}  {result.name}: {result.detail}{fix} [{result.seconds:.1f} s]"


def write_report(out: Path, env: dict, node: Node, results: list[CheckResult], overrides: list[str]) -> list[Path]:
    command = shlex.join(["evora", "doctor", "--run", *overrides])
    data = {
        "command": command,
        "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "environment": env,
        "node": {"device": node.device, "engine": node.engine, "model": node.spec.model},
        "checks": [{**asdict(r), "proves": CHECKS[r.name].proves} for r in results],
    }
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "doctor-report.json", out / "doctor-report.md"
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(markdown(data, env))
    return [md_path, json_path]


def cell(text: str) -> str:
    """Text in a Markdown table's cell: its pipes escaped."""
    return text.replace("|", "\\|")


def markdown(data: dict, env: dict) -> str:
    rows = [
        f"| {c['name']} | {c['status']} | {cell(c['detail'])}{' (change: ' + cell(c['fix']) + ')' if c['fix'] else ''} "
        f"| {c['seconds']:.1f} |"
        for c in data["checks"]
    ]
    topology = f"\n```text\n{env['topology']}\n```\n" if env["topology"] else ""
    return "\n".join(
        [
            "## evora doctor --run",
            "",
            f"`{data['command']}` ({data['written']}) on {data['node']['device']}, "
            f"engine={data['node']['engine']}, model `{data['node']['model']}`",
            "",
            "```text",
            *environment_lines(env),
            "```",
            topology,
            "| check | result | detail | s |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
