"""Model cards: a README.md in the Hugging Face Hub's conventions in every adapter and model folder
a run exports, so that `huggingface-cli upload <repo> <folder>` publishes a complete page.

The front matter is huggingface_hub's own (`ModelCardData`): `base_model`, `library_name` (peft
for adapters, transformers for a whole model), tags, and the held-out results as `model-index`.
The text says what the folder is, the method, the task, the held-out numbers beside the base
model's, the compute, the evora version, and the command that reproduces the run: the run's
config groups and every key whose value differs from what they compose to, so that composing
that command gives the run's config again (tests/unit/test_model_cards.py)."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from evora.config.schema import RunConfig
from evora.lora.peft_io import CONFIG_FILE as ADAPTER_CONFIG
from evora.models import locate_model
from evora.plan.compose import compose_run, is_option
from evora.strategies.registry import get_strategy
from evora.tracking.run_dir import REDACTED, config_dict
from evora.version import __version__

CARD_FILE = "README.md"
GROUPS = ("model", "task", "strategy", "engine", "hardware", "tracking")
# A resumed run reproduces as the run it continued; where its folder goes is the user's.
NOT_REPRODUCED = ("resume", "tracking.out_dir")
BARE = re.compile(r"[A-Za-z_/~][A-Za-z0-9_./:~-]*")  # a Hydra override value that needs no quotes
NOT_STRINGS = {"true", "false", "null", "none", "inf", "nan"}  # bare, Hydra reads these as other types
SHOWN_METRICS = ("fitness", "reward", "accuracy")
# Which of the summary's held-out metrics describe which exported folder (the center's: "final";
# others, such as the ecology's organelles, have none of their own).
FOLDER_METRICS = {"best": "best", "best_model": "best", "model": "final", "delta": "final"}

TEMPLATE = """---
{{ card_data }}
---

# {{ title }}

{{ body }}
"""


# --- the command that reproduces a run ------------------------------------------------------


def hydra_value(value: Any) -> str:
    """`value` as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value) if not isinstance(value, float) or math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if BARE.fullmatch(text) and text.lower() not in NOT_STRINGS:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"


def leaves(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf; lists are leaves, and so are empty dicts."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def reproducing_overrides(run: RunConfig) -> list[str]:
    """The config groups the run chose and every key it set apart from their composition. A
    group whose name is none of its options (`model.name=my_model`, a task class by import
    path that is not registered) is left at the default option, and its keys that differ are set
    one by one."""
    choices = [f"{group}={getattr(run, group).name}" for group in GROUPS if is_option(group, getattr(run, group).name)]
    composed = dict(leaves(config_dict(compose_run(choices, validated=False))))
    overrides = list(choices)
    for key, value in leaves(config_dict(run)):
        if key in NOT_REPRODUCED or value == REDACTED or (key in composed and composed[key] == value):
            continue
        overrides.append(f"{'' if key in composed else '+'}{key}={hydra_value(value)}")
    return overrides


def reproduce_command(run: RunConfig) -> str:
    return "evora " + " ".join(shlex.quote(o) for o in reproducing_overrides(run))


# --- the cards ------------------------------------------------------------------------------


def exported_folders(run_dir: Path, adapters: dict[str, str]) -> Iterator[tuple[str, Path, str]]:
    """(name, folder, library) of every adapter or model folder among the summary's exports;
    a folder of adapters (the ecology's organelles) gives each of its members."""
    for name, relative in adapters.items():
        folder = run_dir / relative
        if (folder / ADAPTER_CONFIG).is_file():
            yield name, folder, "peft"
        elif (folder / "config.json").is_file():
            yield name, folder, "transformers"
        elif folder.is_dir():
            for member in sorted(p for p in folder.iterdir() if (p / ADAPTER_CONFIG).is_file()):
                yield f"{name}/{member.name}", member, "peft"


def folder_metrics(name: str, summary: dict[str, Any]) -> dict[str, float] | None:
    """The held-out metrics of what `name` holds: the best, the final center, or None (unknown)."""
    center = summary.get("center") or "final"
    key = FOLDER_METRICS.get(name, "final" if name == center else None)
    return summary.get(key) if key else None


def eval_results(metrics: dict[str, float] | None, task: str, split_size: int) -> list[EvalResult]:
    shown = [(k, v) for k, v in (metrics or {}).items() if k in SHOWN_METRICS and v is not None and math.isfinite(v)]
    return [
        EvalResult(
            task_type="text-generation",
            dataset_type=task,
            dataset_name=task,
            dataset_split=f"held-out ({split_size} examples)",
            metric_type=key,
            metric_value=value,
            metric_name=f"held-out {key}",
        )
        for key, value in shown
    ]


def results_table(metrics: dict[str, float] | None, base: dict[str, float]) -> str:
    if metrics is None:
        return "No held-out numbers of this folder on its own: the run's best and final are in `eval/summary.json`."
    keys = [k for k in metrics if isinstance(metrics[k], (int, float)) and k in base]
    rows = [f"| {k} | {base[k]:.4g} | {metrics[k]:.4g} | {metrics[k] - base[k]:+.4g} |" for k in keys]
    return "\n".join(["| metric | base model | this folder | difference |", "|---|---|---|---|", *rows])


def compute_lines(compute: dict[str, Any]) -> str:
    seconds, search, evaluation = compute["seconds"], compute["search"], compute["evaluation"]
    return (
        f"- base model parameters: {compute['parameters']:,}\n"
        f"- search: {search['tokens_generated']:,} tokens generated, {search['tokens_trained']:,} trained, "
        f"{search['flops']:.3g} FLOPs\n"
        f"- evaluation: {evaluation['tokens_generated']:,} tokens generated, {evaluation['flops']:.3g} FLOPs\n"
        f"- wall-clock: {seconds['total']:.0f} s (search {seconds['search']:.0f} s)"
    )


def usage(base_model: str, library: str, name: str) -> str:
    """`base_model`: where it loads from (a bundled model's folder, not its `evora:` name)."""
    if library == "transformers":
        return (
            "```python\nfrom transformers import AutoModelForCausalLM\n"
            'model = AutoModelForCausalLM.from_pretrained("<this repo>")\n```'
        )
    return (
        "```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM\n"
        f'base = AutoModelForCausalLM.from_pretrained("{base_model}")\n'
        'model = PeftModel.from_pretrained(base, "<this repo>")\n```\n\n'
        f"With vLLM: `vllm serve {base_model} --enable-lora --lora-modules {name.replace('/', '-')}=<this folder>`"
    )


def card(
    name: str, library: str, run: RunConfig, summary: dict[str, Any], heldout_size: int, command: str
) -> ModelCard:
    base_model, task, strategy = run.model.path, run.task.name, summary["strategy"]
    metrics = folder_metrics(name, summary)
    data = ModelCardData(
        base_model=base_model,
        library_name=library,
        pipeline_tag="text-generation",
        tags=["evora", "evolution-strategies", strategy, task, *(["lora", "peft"] if library == "peft" else [])],
        model_name=f"{run.name}: {name}",
        eval_results=eval_results(metrics, task, heldout_size) or None,
    )
    what = "A LoRA adapter" if library == "peft" else "The whole model"
    body = "\n\n".join(
        [
            f"{what} (`{name}`) of `{base_model}` found by evora {__version__} with "
            f"`strategy={strategy}` ({get_strategy(strategy).summary}) on the task `{task}`, "
            f"{summary['generations']} generations, seed {run.seed}.",
            f"## Held-out results ({heldout_size} examples)\n\n{results_table(metrics, summary['base'])}",
            f"## Compute\n\n{compute_lines(summary['compute'])}",
            f"## Use\n\n{usage(locate_model(base_model).path, library, name)}",
            f"## Reproduce\n\n```bash\npip install evora=={__version__}\n{command}\n```",
        ]
    )
    return ModelCard.from_template(data, template_str=TEMPLATE, title=f"{run.name}: {name}", body=body)


def write_model_cards(run_dir: Path, run: RunConfig, summary: dict[str, Any], heldout_size: int) -> list[Path]:
    """A README.md in every exported adapter and model folder; returns their paths."""
    paths, command = [], reproduce_command(run)
    for name, folder, library in exported_folders(run_dir, summary["adapters"]):
        card(name, library, run, summary, heldout_size, command).save(folder / CARD_FILE)
        paths.append(folder / CARD_FILE)
    return paths
