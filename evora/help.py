"""`evora --help`: what evora is, its subcommands, its config groups with their real
options, the registered strategies, and example command lines (instead of Hydra's page)."""

from __future__ import annotations

from evora.commands import SUBCOMMANDS
from evora.plan.compose import GROUPS, group_options
from evora.strategies import entries

RUN = ("(none)", "run a job: evora [key=value ...] (Hydra overrides; -m sweeps)")
EXAMPLES = (
    "evora +experiment=quickstart/es                  # the quickstart: tiny model, CPU, local Ray",
    "evora model=qwen2_5_0_5b task=countdown strategy=es hardware=gpu",
    "evora -m strategy=es,ga seed=0,1,2              # a sweep: one run per combination",
    "evora resume=runs/<run folder>                   # continue a run from its last checkpoint",
    "evora compare runs/<run> runs/<run>              # compare.md and plots/compare.png",
)


def help_text() -> str:
    lines = [
        "evora: evolve LoRA adapters of large language models (evolution strategies, genetic algorithms,",
        "population-based training) as a distributed job on Ray, with vLLM multi-LoRA engines.",
        "",
        "usage: evora [subcommand] [key=value ...]      evora <subcommand> --help",
        "",
        "subcommands:",
    ]
    commands = [RUN, *((name, command.summary) for name, command in SUBCOMMANDS.items())]
    lines += [f"  {name:<9} {text}" for name, text in commands]
    lines += ["", "config groups (choose with group=option; every key can be set, e.g. strategy.sigma=0.002):"]
    lines += [f"  {group:<9} {', '.join(group_options(group))}" for group in GROUPS]
    lines += ["", "strategies:"]
    lines += [f"  {entry.name:<9} {entry.summary}" for entry in entries()]
    lines += ["  a user's strategy: strategy.name=<module>:<class> (see docs/architecture.md)", "", "examples:"]
    lines += [f"  {example}" for example in EXAMPLES]
    lines += ["", "other flags: --cfg job (print the composed config), --hydra-help (Hydra's own flags)"]
    return "\n".join(lines)
