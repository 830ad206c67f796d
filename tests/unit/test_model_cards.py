"""Model cards (evora/distributed/model_cards.py): the command a card gives composes to the run's
own config, and every exported folder's README.md is Hub front matter with the keys a page needs,
the held-out numbers of what the folder holds and that command."""

from __future__ import annotations

import shlex

import pytest
import yaml
from huggingface_hub import ModelCard
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from evora import __version__
from evora.distributed.model_cards import CARD_FILE, hydra_value, reproduce_command, write_model_cards
from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.lora.peft_io import save_adapter
from evora.plan.compose import CONF_DIR, compose_run
from evora.tracking.run_dir import config_dict

RUNS = [
    [],
    [
        "+experiment=quickstart/ga",
        "seed=3",
        "generations=7",
        "strategy.mutation_scale=0.0125",
        "lora.target_modules=[q_proj,v_proj]",
    ],
    ["engine=hf", "task=countdown", "name='it\\'s a \"run\"'", "lora.rank=8", "lora.layers=[0,1]"],
    [
        "+experiment=quickstart/eggroll",
        "strategy.population=6",
        "tracking=wandb",
        "tracking.wandb_project=p q",
        "eval_every=0",
    ],
    [
        "+experiment=quickstart/ecology",
        "task.max_tokens=12",
        "task.fitness=reward - 0.1 * tokens",
        "hardware.num_workers=1",
    ],
]


@pytest.mark.parametrize("overrides", RUNS, ids=lambda o: " ".join(o)[:40] or "quickstart")
def test_the_reproducing_command_composes_to_the_runs_own_config(overrides):
    run = compose_run(overrides, validated=False)
    command = reproduce_command(run)
    words = shlex.split(command)
    assert words[0] == "evora" and "strategy=" + run.strategy.name in words
    assert config_dict(compose_run(words[1:], validated=False)) == config_dict(run)


def test_a_users_own_names_reproduce_as_keys_on_the_default_options():
    """A model named by its user and a task class by import path are none of their groups'
    options: composing `model=my_model` would fail the finished run's cards."""
    run = compose_run(["model=gpt2", "model.name=my_model", "task.name=custom_example:EvenSumsTask", "seed=2"])
    words = shlex.split(reproduce_command(run))
    assert not any(w.startswith(("model=", "task=")) for w in words)
    assert "model.name=my_model" in words and "task.name=custom_example:EvenSumsTask" in words
    assert config_dict(compose_run(words[1:])) == config_dict(run)


def test_the_command_is_made_where_hydra_runs_already():
    """PBT's finish runs in the CLI's process, inside its @hydra.main on the same config folder."""
    run = compose_run(["+experiment=quickstart/ga", "seed=4"], validated=False)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        words = shlex.split(reproduce_command(run))
        assert config_dict(compose_run(words[1:], validated=False)) == config_dict(run)


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -3,
        0.1,
        1e-05,
        float("inf"),
        "null",
        "1.5",
        ".5",
        "a b",
        "it's",
        "${x}",
        "/a/b-c",
        [1, "x y"],
        {"k": 2},
    ],
)
def test_a_value_reads_back_as_itself_through_hydras_override_parser(value):
    parsed = OverridesParser.create().parse_override(f"key={hydra_value(value)}").value()
    assert OmegaConf.to_container(OmegaConf.create({"v": parsed}), resolve=True)["v"] == value


def summary_of(adapters: dict[str, str]) -> dict:
    spend = {"tokens_prompt": 10, "tokens_generated": 20, "tokens_scored": 0, "tokens_trained": 0}
    spend |= {"flops_inference": 1e9, "flops_training": 0.0, "flops": 1e9}
    return {
        "strategy": "es",
        "generations": 3,
        "center": "mean",
        "base": {"fitness": 0.25, "reward": 0.25, "accuracy": 0.2},
        "final": {"fitness": 0.3, "reward": 0.3, "accuracy": 0.25},
        "best": {"fitness": 0.5, "reward": 0.5, "accuracy": 0.4},
        "adapters": adapters,
        "compute": {
            "parameters": 1000,
            "search": spend,
            "evaluation": spend,
            "seconds": {"setup": 1.0, "search": 2.0, "evaluation": 1.0, "total": 4.0},
        },
    }


def front_matter(path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_every_exported_folder_has_a_card_with_its_own_held_out_numbers(tmp_path, tiny_shapes, tiny_path):
    layout = build_layout(tiny_shapes, rank=1, alpha=2, target_modules=["q_proj"], layers=None, base_model=tiny_path)
    tensors = random_adapter(layout, seed=0, a_std=None, b_std=0.1)
    for folder in ("best", "mean", "organelles/o1", "organelles/o2"):
        save_adapter(tmp_path / "adapters" / folder, tensors, layout)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a whole model (EGGROLL's final weights)
    adapters = {"best": "adapters/best", "mean": "adapters/mean", "organelles": "adapters/organelles"}
    adapters |= {"model": "model", "routing": "routing.json"}
    run = compose_run(["seed=5"], validated=False)
    paths = write_model_cards(tmp_path, run, summary_of(adapters), heldout_size=40)
    assert sorted(p.parent.name for p in paths) == ["best", "mean", "model", "o1", "o2"]
    for path in paths:
        meta = front_matter(path)
        assert meta["base_model"] == run.model.path
        assert meta["library_name"] == ("transformers" if path.parent.name == "model" else "peft")
        assert {"evora", "es", run.task.name} <= set(meta["tags"])
        card = ModelCard.load(path)  # what the Hub's client reads
        assert card.data.base_model == run.model.path
        assert reproduce_command(run) in card.text and f"evora=={__version__}" in card.text
    summary = summary_of(adapters)
    for folder, numbers in (
        ("adapters/best", summary["best"]),
        ("adapters/mean", summary["final"]),
        ("model", summary["final"]),
    ):
        results = front_matter(tmp_path / folder / CARD_FILE)["model-index"][0]["results"]
        assert {m["type"]: m["value"] for r in results for m in r["metrics"]} == numbers
    # An organelle's own numbers are not known: its card says so and claims none.
    assert "model-index" not in front_matter(tmp_path / "adapters/organelles/o1" / CARD_FILE)
