"""evora.analysis.plots / report and `evora analyze`, over run folders built by hand in the
formats real runs write (ES quickstart, GA lineage, PBT trials/lineage, a sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import make_summary
from evora.analysis import plots, report
from evora.cli import main
from evora.strategies import figures
from evora.strategies.pbt import analysis as pbt

PNG = b"\x89PNG\r\n\x1a\n"


def _jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _es_metrics(generations: int = 6) -> list[dict]:
    records = [{"generation": 0, "heldout_reward": 0.5, "base_heldout_reward": 0.5, "time": 0.0}]
    for g in range(1, generations + 1):
        r = {
            "generation": g,
            "reward_mean": 0.5 + 0.05 * g,
            "reward_min": 0.1,
            "reward_max": 0.9 + 0.01 * g,
            "reward_p20": 0.4 + 0.04 * g,
            "reward_p80": 0.6 + 0.05 * g,
            "tokens": 1000,
            "tokens_per_second": 7000.0,
            "seconds_materialise": 0.02,
            "seconds_generate": 2.0,
            "seconds_reward": 0.001,
            "seconds_update": 0.003,
        }
        if g % 3 == 0:
            r["heldout_reward"] = {3: 0.9, 6: 0.85}[g]  # peaks before the end
        records.append(r)
    return records


def _config(strategy: dict, generations: int = 6) -> dict:
    return {
        "seed": 0,
        "name": "quickstart",
        "generations": generations,
        "model": {"name": "tiny", "path": "evora:tiny"},
        "task": {"name": "addition"},
        "strategy": strategy,
    }


@pytest.fixture
def es_run(tmp_path: Path) -> Path:
    run = tmp_path / "2026-01-01_00-00-00_quickstart"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump(_config({"name": "es", "population": 32, "sigma": 0.3, "lr": 0.05}))
    )
    _jsonl(run / "metrics.jsonl", _es_metrics())
    (run / "eval" / "summary.json").write_text(json.dumps(make_summary(0.5, 0.9, 0.85)))
    (run / "eval" / "best_vs_base.json").write_text(
        json.dumps(
            {
                "task": "addition",
                "split": "heldout",
                "adapter": "adapters/best",
                "examples": 8,
                "adapter_metrics": {"reward": 0.9, "accuracy": 0.875},
                "base_metrics": {"reward": 0.5, "accuracy": 0.5},
                "counts": {"improvements": 3, "regressions": 0, "both_wrong": 1, "both_right": 4},
                "improvements": [],
            }
        )
    )
    return run


GA_LINEAGE = [
    {"generation": 1, "id": "g0-00-init", "index": 0, "op": "elite", "parents": [], "fitness": 0.5, "survived": True},
    {
        "generation": 1,
        "id": "g1-01-mutate",
        "index": 1,
        "op": "mutate",
        "parents": ["g0-00-init"],
        "fitness": 0.6,
        "survived": True,
    },
    {
        "generation": 1,
        "id": "g1-02-mutate",
        "index": 2,
        "op": "mutate",
        "parents": ["g0-00-init"],
        "fitness": 0.3,
        "survived": False,
    },
    {"generation": 2, "id": "g1-01-mutate", "index": 0, "op": "elite", "parents": [], "fitness": 0.6, "survived": True},
    {
        "generation": 2,
        "id": "g2-01-crossover",
        "index": 1,
        "op": "crossover",
        "parents": ["g1-01-mutate", "g0-00-init"],
        "fitness": 0.7,
        "survived": True,
    },
    {
        "generation": 2,
        "id": "g2-02-mutate",
        "index": 2,
        "op": "mutate",
        "parents": ["g1-01-mutate"],
        "fitness": 0.4,
        "survived": False,
    },
]


def _trials() -> list[dict]:
    rows = []
    for g, members in (
        (1, [(1, 0.003, 0.9), (16, 0.001, 0.5), (8, 0.0003, 0.4)]),
        (2, [(1, 0.003, 0.92), (1, 0.00375, 0.8), (16, 0.001, 0.55)]),
    ):
        for i, (rank, lr, fitness) in enumerate(members):
            rows.append(
                {
                    "trial": f"t{i}",
                    "generation": g,
                    "member": f"r{rank}_lr{lr}_g{g - 1}",
                    "parent": "",
                    "fitness": fitness,
                    "reward": fitness,
                    "accuracy": fitness,
                    "perplexity": 1.2,
                    "loss": 0.2,
                    "step": 20 * g,
                    "rank": rank,
                    "alpha_multiplier": 2.0,
                    "learning_rate": lr,
                    "dropout": 0.0,
                    "target_modules": "down_proj",
                }
            )
    return rows


@pytest.fixture
def pbt_run(tmp_path: Path) -> Path:
    run = tmp_path / "pbt"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(_config({"name": "pbt", "population": 3}, 2)))
    trials = _trials()
    _jsonl(run / "trials.jsonl", trials)
    _jsonl(
        run / "metrics.jsonl",
        [
            {"generation": g, "fitness_max": max(f), "fitness_median": sorted(f)[1], "fitness_min": min(f), "trials": 3}
            for g in (1, 2)
            for f in [[t["fitness"] for t in trials if t["generation"] == g]]
        ],
    )
    _jsonl(
        run / "lineage.jsonl",
        [
            {
                "generation": 1,
                "op": "exploit",
                "trial": "t1",
                "from_trial": "t0",
                "parent": "r1_lr0.003_g0",
                "id": "r1_lr0.00375_g1",
                "fitness": 0.9,
                "changes": {"learning_rate": [0.003, 0.00375]},
                "operations": {"learning_rate": "x1.25"},
            }
        ],
    )
    (run / "eval" / "summary.json").write_text(
        json.dumps(
            make_summary(
                0.47,
                0.95,
                strategy="pbt",
                best_member="r1_lr0.003_g0",
                best_generation=None,
                details={"best_hyperparameters": {"rank": 1}},
            )
        )
    )
    return run


def test_reward_plot_has_mean_best_band_heldout_and_base():
    fig = plots.plot_reward(_es_metrics())
    ax = fig.axes[0]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("Reward over generations", "generation", "reward")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["population p20–p80", "population mean", "best member", "held-out", "base model held-out"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["held-out"].get_xdata()) == [0, 3, 6]  # only generations that have it
    assert list(lines["base model held-out"].get_ydata()) == [0.5, 0.5]
    assert lines["base model held-out"].get_linestyle() == "--"
    assert len(ax.collections) == 1  # the p20-p80 band


def test_pbt_reward_plot_shows_fitness():
    metrics = [{"generation": g, "fitness_max": 0.9, "fitness_median": 0.6, "fitness_min": 0.5} for g in (1, 2)]
    ax = pbt.plot_fitness(metrics).axes[0]
    assert ax.get_ylabel() == "fitness"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["best", "median", "worst"]


def test_timing_plot_stacks_four_phases_with_tokens_on_twin_axis():
    metrics = [{**r, "seconds": 1.5} if r["generation"] else r for r in _es_metrics()]
    fig = plots.plot_timing(metrics)
    ax, twin = fig.axes
    assert (ax.get_xlabel(), ax.get_ylabel(), twin.get_ylabel()) == (
        "generation",
        "seconds (summed over workers)",
        "tokens/s",
    )
    assert len(ax.containers) == 4 and all(len(c) == 6 for c in ax.containers)  # generation 0 has no timing
    assert list(ax.lines[0].get_ydata()) == [1.5] * 6  # the wall-clock over the summed phases
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "wall-clock",
        "materialise",
        "generate",
        "reward",
        "update",
        "tokens/s",
    ]


def test_lineage_plot_edges_survivors_and_colorbar():
    fig = plots.plot_lineage(GA_LINEAGE)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "generation"
    edges = figures.edges(figures.positions(GA_LINEAGE))
    # gen 1: two mutations of the elite; gen 2: elite carried, crossover (2 parents), mutation
    assert len(edges) == 2 + 1 + 2 + 1
    assert ((1, 1), (2, 0)) in edges  # the elite carried over from its previous position
    assert len(fig.axes) == 2  # the colorbar
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["survived"]


def test_ga_mutation_effects_child_minus_best_parent():
    effects = plots.mutation_effects(GA_LINEAGE)
    assert effects["mutate"] == pytest.approx([0.1, -0.2, -0.2])
    assert effects["crossover"] == pytest.approx([0.1])
    assert "elite" not in effects
    ax = plots.plot_mutation_effects(effects).axes[0]
    assert ax.get_ylabel() == "fitness change"


def test_pbt_effects_heatmap_and_survival(pbt_run: Path):
    trials = pbt.read_trials(pbt_run)
    lineage = plots.read_jsonl(pbt_run / "lineage.jsonl")
    assert pbt.exploit_effects(lineage, trials) == {"learning_rate": [pytest.approx(0.8 - 0.9)]}
    ax = pbt.plot_hyperparameter_heatmap(trials).axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("learning rate", "rank")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "8", "16"]
    fig = pbt.plot_hyperparameter_survival(trials)
    assert [a.get_title() for a in fig.axes] == [
        "rank",
        "alpha multiplier",
        "learning rate",
        "dropout",
        "target modules",
    ]
    assert [p.get_height() for p in fig.axes[0].containers[1]] == [2, 0, 1]  # last generation: rank 1 x2, 16


def test_sweep_groups_pool_seeds():
    rows = [
        {"overrides": f"strategy.sigma={s} seed={seed}", "final_heldout": 0.5 + seed / 10}
        for s in (0.1, 0.2)
        for seed in (0, 1)
    ]
    assert plots.sweep_groups(rows) == {"strategy.sigma=0.1": [0.5, 0.6], "strategy.sigma=0.2": [0.5, 0.6]}
    ax = plots.plot_sweep(rows).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["strategy.sigma=0.1", "strategy.sigma=0.2"]
    assert ax.get_xlabel() == "final held-out reward"


def test_write_plots_and_report_for_es(es_run: Path):
    paths = plots.write_plots(es_run)
    assert [p.name for p in paths] == ["reward.png", "timing.png"]
    assert all(p.read_bytes().startswith(PNG) and p.parent == es_run / "plots" for p in paths)
    text = report.write_report(es_run, paths).read_text()
    assert "adapters/best" in text and "| 0.5000 | 0.8500 | 0.9000 |" in text
    assert "Compute: 1e+09 FLOPs searching (50 tokens generated, 0 trained)" in text
    assert "![reward](plots/reward.png)" in text
    assert "peaked at generation 3" in text and "`generate` takes" in text
    assert "3 improvements, 0 regressions, 1 both wrong" in text


def test_write_plots_and_report_for_pbt(pbt_run: Path):
    names = [p.name for p in plots.write_plots(pbt_run)]
    assert names == ["reward.png", "lineage.png", "mutations.png", "hyperparameters.png", "survival.png"]
    text = report.write_report(pbt_run).read_text()
    assert "best member: `r1_lr0.003_g0`" in text and "| 0.4700 | - | 0.9500 |" in text
    assert "learning_rate 0.001, 0.003, 0.00375" in text


def test_cli_analyze_run_and_sweep(es_run: Path, tmp_path: Path, capsys):
    main(["analyze", str(es_run)])
    assert str(es_run / "report.md") in capsys.readouterr().out
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep_summary.json").write_text(
        json.dumps(
            [
                {"job": i, "overrides": f"strategy={s} generations=1", "final_heldout": f}
                for i, (s, f) in enumerate((("es", 0.69), ("ga", 0.94)))
            ]
        )
    )
    main(["analyze", str(sweep)])
    assert (sweep / "plots" / "sweep.png").read_bytes().startswith(PNG)
    assert "`strategy=ga generations=1` | 1 | 0.9400" in (sweep / "report.md").read_text()


def test_cli_analyze_missing_folder(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["analyze", str(tmp_path / "nope")])
    assert exit_.value.code == 2 and "no such folder" in capsys.readouterr().err


def test_analysis_imports_no_ray_vllm_wandb():
    import subprocess
    import sys

    code = (
        "import sys, evora.analysis.report, evora.runs; "
        "print([m for m in ('ray', 'vllm', 'wandb') if m in sys.modules])"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_pbt_tree_follows_exploits(pbt_run: Path):
    trials = pbt.read_trials(pbt_run)
    nodes = pbt.pbt_tree(plots.read_jsonl(pbt_run / "lineage.jsonl"), trials)
    parents = {n["id"]: n["parents"] for n in nodes}
    assert parents["t1@2"] == ["t0@1"] and parents["t2@2"] == ["t2@1"]  # t1 was overwritten by t0
    assert [n["survived"] for n in nodes] == [False] * 3 + [True] * 3
    fig = plots.plot_lineage(nodes)
    assert len(fig.axes[0].collections[0].get_segments()) == 3
