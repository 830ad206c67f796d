"""ES against its baselines on the quickstart, through the real CLI: SFT and GRPO matched
to an ES run's search compute (strategy.match), then `evora compare` over ES, GA, PBT,
SFT and GRPO with reward, KL and compute."""

from __future__ import annotations

import json

import pytest

from conftest import cli_run, run_evora
from evora.tracking.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pbt-run")]  # shares the PBT run of test_cli.py

FAST = ["engine=hf", "hardware.num_workers=1", "task.eval_size=64", "eval_every=2"]
ES = ["+experiment=quickstart/es", *FAST, "strategy.population=8", "task.prompts_per_generation=16", "generations=4"]
PBT = [
    "+experiment=quickstart/pbt",
    "generations=3",
    "tracking=wandb",
    "tracking.wandb_mode=offline",
]  # test_cli.py's run
MEMETIC_GA = [
    *FAST,
    "+experiment=quickstart/ga",
    "strategy.population=8",
    "task.prompts_per_generation=16",
    "generations=4",
    "strategy.refine=sft",
    "strategy.refine_every=2",
    "strategy.refine_steps=5",
    "strategy.refine_learning_rate=0.01",
]
GRPO_SMALL = ["strategy.num_generations=2", "strategy.prompts_per_step=2", "strategy.steps_per_generation=2"]


def summary_of(run_dir):
    return json.loads((run_dir / "eval" / "summary.json").read_text())


def search_flops(run_dir) -> float:
    return summary_of(run_dir)["compute"]["search"]["flops"]


@pytest.fixture(scope="module")
def es_run():
    return cli_run(*ES)[0]


@pytest.mark.parametrize("strategy,extra", [("sft", []), ("grpo", GRPO_SMALL)])
def test_a_baseline_matched_to_an_es_run_spends_its_compute(es_run, strategy, extra):
    run_dir, stdout = cli_run(*FAST, f"+experiment=quickstart/{strategy}", f"strategy.match={es_run}", *extra)
    target, spent = search_flops(es_run), search_flops(run_dir)
    assert target > 0 and abs(spent - target) / target <= 0.10, (spent, target)
    summary = summary_of(run_dir)
    assert summary["strategy"] == strategy and summary["compute"]["search"]["tokens_trained"] > 0
    records = read_metrics(run_dir)
    assert records[-1]["heldout_reward"] is not None  # evaluated on the worker pool at the generation it stopped
    assert "heldout_kl" in records[-1] and summary["best"]["kl"] >= 0
    assert (run_dir / "adapters" / "best" / "adapter_model.safetensors").is_file()
    if strategy == "grpo":
        assert summary["compute"]["search"]["tokens_generated"] > 0  # its sampling is counted too


def test_memetic_ga_refines_its_elite_and_counts_the_steps():
    run_dir, _ = cli_run(*MEMETIC_GA)
    trained = {r["generation"]: r["tokens_trained"] for r in read_metrics(run_dir)[1:]}
    assert trained[2] > 0 and trained[4] > 0 and trained[1] == trained[3] == 0  # refined after generations 2 and 4
    lineage = read_metrics(run_dir, "lineage.jsonl")
    refined = [r for r in lineage if r["op"] == "refine"]
    assert [r["generation"] for r in refined] == [2, 4] and all(r["steps"] == 5 for r in refined)
    # Lamarckian: the refined adapter is the next generation's elite, under its new id
    assert any(r["op"] == "elite" and r["id"] == refined[0]["id"] and r["generation"] == 3 for r in lineage)
    assert summary_of(run_dir)["compute"]["search"]["tokens_trained"] == sum(trained.values())


def test_compare_shows_es_ga_pbt_sft_and_grpo_with_reward_kl_and_compute(es_run, tmp_path):
    runs = [
        es_run,
        cli_run(*MEMETIC_GA)[0],
        cli_run(*PBT)[0],
        cli_run(*FAST, "+experiment=quickstart/sft", f"strategy.match={es_run}")[0],
        cli_run(*FAST, "+experiment=quickstart/grpo", f"strategy.match={es_run}", *GRPO_SMALL)[0],
    ]
    result = run_evora(["compare", *map(str, runs), "--out", str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (tmp_path / "compare.md").read_text()
    for strategy in ("es", "ga", "pbt", "sft", "grpo"):
        assert f"| {strategy} |" in table or f" {strategy} " in table, (strategy, table)
    assert "KL" in table and (tmp_path / "plots" / "reward_kl.png").stat().st_size > 0
    print(table)  # the note's compare table
