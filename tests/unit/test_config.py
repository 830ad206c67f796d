"""Every shipped config composes and validates; bad values fail with one line naming the key."""

import dataclasses
from pathlib import Path

import pytest

from conftest import MERGE_SOURCES
from evora.config.schema import RunConfig
from evora.errors import ConfigError
from evora.plan.compose import CONF_DIR, GROUPS, compose_run, expand_jobs, group_options, new_run_dir, overrides_of
from evora.plan.jobs import preflight
from evora.strategies import get_strategy
from evora.strategies.es import ESConfig


def test_the_default_is_the_tiny_model_and_the_quickstart_is_a_named_experiment():
    run = compose_run([])
    assert isinstance(run, RunConfig) and isinstance(run.strategy, ESConfig)
    assert run.model.path == "evora:tiny" and run.hardware.name == "cpu" and run.engine.name == "vllm"
    assert run.task.name == "addition" and run.lora.target_modules == "auto" and run.strategy.sigma == 0.001
    quickstart = compose_run(["+experiment=quickstart/es"])  # `make run`
    assert quickstart.lora.target_modules == ["down_proj"] and quickstart.lora.layers == [1]
    assert (quickstart.strategy.sigma, quickstart.strategy.optimizer) == (0.3, "adam")
    assert dataclasses.replace(quickstart, lora=run.lora, strategy=run.strategy) == run  # nothing else


@pytest.mark.parametrize("strategy", sorted(group_options("strategy")))
def test_each_strategy_has_a_quickstart_experiment_on_the_tiny_model(strategy):
    run = compose_run([f"+experiment=quickstart/{strategy}"])
    assert (run.model.name, run.strategy.name, run.name) == ("tiny", strategy, f"tiny_addition_{strategy}")


ORGANISM_CANDIDATES = 48 * 16  # organism/es: the search budget every evolution strategy there spends


@pytest.mark.parametrize("strategy", sorted(group_options("strategy")))
def test_each_strategy_has_an_organism_experiment_at_the_matched_budget(strategy):
    """bench/organism.py's experiments: the organism's problems (model_task/organism_countdown.yaml,
    or the ecology's mixture), and organism/es's compute: as many candidates, or its FLOPs."""
    adapters = ["strategy.adapters=[evora:tiny_adapters/evolved,evora:tiny_adapters/noise]"] * (strategy == "merge")
    run = compose_run([f"+experiment=organism/{strategy}", *adapters])
    assert (run.model.name, run.strategy.name) == ("organism", strategy)
    countdown = run.task.family_options["countdown"] if run.task.name == "mix" else vars(run.task)
    assert countdown["max_number"] == 12 and run.task.max_tokens == 48
    assert run.task.eval_size == 256 and run.task.prompts_per_generation == 32
    cfg = run.strategy
    if strategy in ("sft", "grpo", "grpo_full"):
        assert cfg.budget_flops == 6.1e12
    elif strategy == "randopt":
        assert cfg.population * run.generations == ORGANISM_CANDIDATES
    elif strategy not in ("pbt", "ecology"):  # their cost per generation is their own: the table reports it
        assert cfg.population * run.generations == ORGANISM_CANDIDATES, (cfg.population, run.generations)


def test_the_ecologys_niches_are_an_experiment_on_the_tiny_mixture():
    mix = compose_run(["+experiment=quickstart/ecology_mix"])
    assert (mix.model.name, mix.task.name, mix.strategy.name) == ("tiny_mix", "mix", "ecology")
    assert mix.task.families["arithmetic"] == 0 and mix.strategy.episode_fee == 0.3  # model_task/, the experiment


def test_es_defaults_take_the_papers_population_and_sigma():
    """es's own lr, 5e-4, is not the paper's step: es divides by sigma (docs/strategies/es.md)."""
    run = compose_run(["model=qwen2_5_0_5b", "strategy.antithetic=true"])
    assert (run.strategy.population, run.strategy.sigma, run.strategy.lr) == (30, 0.001, 5e-4)
    assert run.strategy.shaping == "zscore"


PAPER_MODELS = ["qwen2_5_0_5b", "qwen2_5_1_5b", "qwen2_5_3b", "qwen2_5_7b", "llama3_2_1b", "llama3_2_3b", "llama3_1_8b"]


@pytest.mark.parametrize("algorithm", ["es_full", "es"])
@pytest.mark.parametrize("model", PAPER_MODELS)
def test_the_paper_countdown_runs_are_named_experiments_for_each_of_its_models(model, algorithm):
    run = compose_run([f"+experiment=qiu2025/countdown_{model}_{algorithm}", "hardware=gpu"])
    es, task = run.strategy, run.task
    assert (run.model.name, task.name, es.name) == (model, "countdown", algorithm)
    assert (es.population, es.sigma, es.antithetic, es.shaping) == (30, 0.001, False, "zscore")
    assert es.lr == (5e-7 if algorithm == "es" else 5e-4)  # the paper's alpha 5e-4; es divides its step by sigma
    assert (task.train_size, task.eval_size, task.prompts_per_generation, task.max_tokens) == (200, 2000, 200, 1024)
    assert (task.split, task.selection_size, task.data_path) == ("ordered", 0, "countdown.json")
    assert (task.number_rule, task.answer_block) == ("all_exactly_once", "last")
    assert (run.generations, run.eval_every, run.name) == (500, 50, f"{model}_countdown_{algorithm}")


@pytest.mark.parametrize("model", PAPER_MODELS)
def test_the_papers_grpo_baselines_are_experiments_that_fit_at_every_size(model):
    """GRPO (30) and Dr.GRPO-v on full weights, each on the paper's Countdown protocol; evora
    doctor (its offline config snapshots) fits the driver's training on an H200 of its own."""
    from evora.doctor import report

    runs = {k: compose_run([f"+experiment=qiu2025/countdown_{model}_{k}", "hardware=gpu"]) for k in ("grpo", "dr_grpo")}
    for kind, run in runs.items():
        grpo, task = run.strategy, run.task
        name = f"{model}_countdown_{'grpo_full' if kind == 'grpo' else kind}"
        assert (run.model.name, task.name, grpo.name, run.name) == (model, "countdown", "grpo_full", name)
        assert (grpo.beta, grpo.temperature, grpo.steps_per_generation, run.hardware.driver_gpus) == (0.0, 1.0, 1, 1)
        assert (task.train_size, task.eval_size, task.max_tokens, task.data_path) == (200, 2000, 1024, "countdown.json")
        h200 = ("hardware=gpu", "hardware.gpu_memory_gib=141")
        lines = report(compose_run([f"+experiment=qiu2025/countdown_{model}_{kind}", *h200], validated=False))
        assert not lines[-1].startswith("verdict"), lines[-1]  # doctor's "cannot run"
        assert any(line.startswith("driver") and line.endswith("-> fits") for line in lines), lines
    grpo, dr = runs["grpo"].strategy, runs["dr_grpo"].strategy
    assert (grpo.num_generations, grpo.prompts_per_step, grpo.learning_rate, grpo.loss_type) == (30, 2, 1e-5, "dapo")
    assert (dr.num_generations * dr.prompts_per_step, dr.learning_rate) == (1024, 1e-6)
    assert (dr.loss_type, dr.scale_rewards) == ("dr_grpo", "none")


def test_what_follows_an_experiment_overrides_it():
    experiment = "+experiment=qiu2025/countdown_qwen2_5_1_5b_es_full"
    run = compose_run([experiment, "model=qwen2_5_3b", "strategy.sigma=0.002"])
    es = run.strategy
    assert (run.model.name, es.name, es.sigma, es.lr) == ("qwen2_5_3b", "es_full", 0.002, 5e-4)


MODELS = sorted(group_options("model"))


@pytest.mark.parametrize("strategy", sorted(group_options("strategy")))
def test_no_models_settings_change_with_its_model_and_strategy_unless_an_experiment_is_named(strategy):
    """What a model changes is its own group (`model.*`) and the run's name, the bundled tiny
    ones' too; tuned or published settings come only with `+experiment=...` (quickstart/...,
    qiu2025/...)."""

    def settings(model: str) -> dict:
        extra = MERGE_SOURCES if strategy == "merge" else ()
        run = dataclasses.asdict(compose_run([f"model={model}", f"strategy={strategy}", "engine=hf", *extra]))
        return {k: v for k, v in run.items() if k not in ("model", "name")}

    reference = settings(MODELS[0])
    assert all(settings(model) == reference for model in MODELS[1:])
    assert reference["generations"] == 30 and reference["task"]["data_path"] is None  # conf/config.yaml's, task's


def test_a_run_is_named_after_model_task_and_strategy_and_its_folder_keeps_to_safe_characters():
    assert compose_run(["task=arithmetic", "strategy=ga"]).name == "tiny_arithmetic_ga"
    assert compose_run(["name=mine"]).name == "mine"
    assert new_run_dir("runs", "tiny_mypkg.tasks:Mine_es").endswith("_tiny_mypkg.tasks-Mine_es")


DATA = Path(__file__).resolve().parents[1] / "data"
# Options that need company: long-context tasks need a real model, jsonl a file, lm_eval a task.
WITH = {
    ("strategy", "merge"): list(MERGE_SOURCES),
    ("task", "jsonl"): [
        f"task.data_path={DATA / 'qa.jsonl'}",
        "task.eval_size=2",
        "task.selection_size=0",
        "task.prompts_per_generation=4",
    ],
    ("task", "lm_eval"): [
        "task.lm_eval_task=evora_addition",
        f"task.lm_eval_path={DATA / 'lm_eval'}",
        "task.train_size=16",
        "task.eval_size=8",
        "task.prompts_per_generation=8",
    ],
}


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_composes(group):
    """Every shipped option (a file in conf/<group>/): another test of this process may have
    registered a plugin's task or strategy (test_documented_commands composes examples/' mypkg)."""
    options = [option for option in group_options(group) if (CONF_DIR / group / f"{option}.yaml").is_file()]
    assert options
    for option in options:
        extra = ["model=qwen2_5_0_5b"] if group == "task" and option != "addition" else []
        run = compose_run([f"{group}={option}", *extra, *WITH.get((group, option), [])])
        named = getattr(run, group).name  # a user's strategy (another test may register one) keeps its import path
        assert named == option or group == "model" or (group == "strategy" and get_strategy(named).name == option)


def test_configs_are_frozen():
    run = compose_run([])
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.strategy.sigma = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "override,message",
    [
        ("strategy=nope", "strategy=nope: unknown option; allowed: ecology, eggroll, es"),
        ("model=gpt5", "model=gpt5: unknown option; allowed: gpt2, llama3_1_8b, llama3_2_1b,"),
        ("strategy.population=1", "strategy.population=1: must be an integer >= 2"),
        ("strategy.population=7", "strategy.population=7: must be even when strategy.antithetic=true"),
        ("lora.rank=3", "lora.rank=3: allowed: 1, 8, 16, 32, 64, 128, 256, 320, 512"),
        ("model.path=/no/such/model", 'model.path="/no/such/model": directory not found'),
        ("strategy.sigma=[1,", "malformed override 'strategy.sigma=[1,'"),
        ("strategy.population=abc", "strategy.population: Value 'abc' of type 'str' could not be converted"),
        ("strategy.bogus=1", "strategy.bogus: unknown key; allowed: name, population, sigma"),
        ("lora.layers=[7]", "lora.layers=[7]: layer 7 out of range; allowed: 0..1"),
        ("strategy.shaping=rank", 'strategy.shaping="rank": allowed: zscore, centered_rank, nes, none'),
        ("strategy=snes strategy.shaping=none", 'strategy.shaping="none": snes needs 0-centred weights and raw'),
        ("task.prompts_per_generation=99999", "task.prompts_per_generation=99999: must be in 1..task.train_size"),
        ("hardware.gpu_memory_utilization=1.5", "hardware.gpu_memory_utilization=1.5: must be in (0, 1]"),
        ("hardware=gpu hardware.gpus_per_worker=2", "hardware.gpus_per_worker=2: allowed: 0 (CPU engines), 1 (GPU"),
        ("hardware.tensor_parallel_size=2", "hardware.tensor_parallel_size=2: > 1 needs GPU engines"),
        ("hardware=gpu hardware.tensor_parallel_size=0", "hardware.tensor_parallel_size=0: must be >= 1"),
        (
            "hardware=gpu engine=hf hardware.tensor_parallel_size=2",
            "> 1 needs GPU engines (hardware.gpus_per_worker=1) that shard a model: engine=vllm",
        ),
        ("engine.units=all", 'engine.units="all": allowed: fixed, whole'),
        ("hardware.noise_device=gpu", 'hardware.noise_device="gpu": allowed: auto, device, host'),
        ("hardware.noise_device=device", 'hardware.noise_device="device": needs GPU workers (hardware=gpu)'),
        (
            "hardware=gpu hardware.tensor_parallel_size=2 hardware.noise_device=device",
            'hardware.noise_device="device": needs workers that hold their GPU (hardware.tensor_parallel_size=1',
        ),
        (
            "hardware=gpu strategy=ga hardware.noise_device=device",
            "strategy=ga redraws its noise on the driver, so it draws on the CPU's streams; use auto or host",
        ),
        ("hardware.driver_restarts=-1", "hardware.driver_restarts=-1: must be >= 0"),
        ("hardware.worker_replacements=-1", "hardware.worker_replacements=-1: must be >= 0"),
        ("strategy.sigma=inf", "strategy.sigma=inf: must be a finite number"),
        ("strategy.lr=-inf", "strategy.lr=-inf: must be a finite number"),
        ("strategy.sigma=nan", "strategy.sigma=nan: must be a finite number"),
        ("task.reward_penalty=-inf", "task.reward_penalty=-inf: must be a finite number"),
        ("strategy=ga strategy.mutation_scale=inf", "strategy.mutation_scale=inf: must be a finite number"),
        ("lora.alpha=inf", "lora.alpha=inf: must be a finite number"),
        ("task.reward_timeout_s=0", "task.reward_timeout_s=0.0: must be > 0"),
        ("task.reward_workers=0", "task.reward_workers=0: must be >= 1"),
        ("resume=/no/such/run", 'resume="/no/such/run": run folder not found'),
        ("lora.target_modules=[c_attn]", "lora.target_modules=['c_attn']: no adaptable module of the model matches"),
        ("task=countdown", "task.max_tokens=1024: must be in 1..model.max_model_len - 1 (511)"),
        ("task.fitness=loss", 'task.fitness="loss": unknown name "loss"'),
        ("task.prompt_format=html", 'task.prompt_format="html": allowed: auto, chat, plain'),
        ("task.reward=nowhere:score", 'task.reward="nowhere:score": cannot load it'),
        (f"task=jsonl task.data_path={DATA / 'qa.jsonl'} task.scorer=bleu", 'task.scorer="bleu": allowed:'),
        ("task.scorer=exact", "task.scorer: unknown key; allowed: name, train_size,"),  # jsonl's key, not addition's
        ("task=countdown task.number_rule=some", 'task.number_rule="some": allowed: all_exactly_once,'),
        (
            "strategy=grpo strategy.rollouts=driver strategy.importance_sampling=token_mask",
            "corrects the engines' sampling: needs strategy.rollouts=engines",
        ),
        ("strategy=grpo strategy.loss_type=ppo", 'strategy.loss_type="ppo": allowed: dapo, grpo, dr_grpo, bnpo, cispo'),
        (
            f"task=jsonl task.data_path={DATA / 'qa.jsonl'}",
            "task.prompts_per_generation=32: the data gives only 0 train",
        ),
    ],
)
def test_bad_values_name_the_key_and_allowed_values(override, message):
    with pytest.raises(ConfigError) as error:
        preflight(override.split(" "))  # composed, validated and planned
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_multirun_jobs_are_each_validated():
    assert len(expand_jobs(["strategy.population=2,4,6", "seed=0,1"])) == 6
    assert len(preflight(["-m", "seed=0,1"])) == 2
    with pytest.raises(ConfigError, match="strategy.population=3"):
        preflight(["-m", "strategy.population=2,3"])


def test_an_optuna_search_interval_is_checked_at_both_ends():
    assert expand_jobs(["strategy.sigma=interval(0.1,0.5)", "seed=0"]) == [
        ["strategy.sigma=0.1", "seed=0"],
        ["strategy.sigma=0.5", "seed=0"],
    ]
    with pytest.raises(ConfigError, match="strategy.sigma=-0.5"):
        preflight(["-m", "hydra/sweeper=optuna", "strategy.sigma=interval(-0.5,0.5)"])
    with pytest.raises(ConfigError, match='objective="best": must be'):
        preflight(["objective=best"])


def test_hydra_print_flags_skip_the_preflight():
    assert overrides_of(["--cfg", "job", "seed=1"]) is None
    assert overrides_of(["-m", "seed=1", "hydra.verbose=true"]) == ["seed=1", "hydra.verbose=true"]
    with pytest.raises(ConfigError, match=r"^--cfg and -m cannot go together"):
        overrides_of(["-m", "seed=0,1", "--cfg", "job"])  # Hydra's own answer is a traceback


def test_vllm_lora_ranks_match_the_installed_vllm():
    vllm_lora = pytest.importorskip("vllm.config.lora")
    from typing import get_args

    from evora.config.schema import VLLM_LORA_RANKS

    assert tuple(get_args(vllm_lora.MaxLoRARanks)) == VLLM_LORA_RANKS


def test_an_empty_data_file_is_named_before_ray(tmp_path):
    """Not 'the data gives no held-out examples (0 train, 0 selection, 0 held-out)': the file."""
    from evora.errors import DataError

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError) as error:
        preflight(["task=jsonl", f"task.data_path={empty}"])
    assert str(error.value) == f"{empty}: the file is empty"


def test_a_judges_wait_must_fit_inside_the_units_deadline():
    """A unit's generation and its wait on the judge share engine.unit_timeout_s: a judge allowed to
    keep a unit longer would get its worker killed as hung, with an error that names neither."""
    judge = ["task.reward=judge", "task.judge.url=http://judge:8000/v1", "task.judge.model=judge"]
    with pytest.raises(ConfigError) as error:
        compose_run([*judge, "engine.unit_timeout_s=60"])
    assert str(error.value).startswith("task.judge.call_timeout_s=600.0: must be below engine.unit_timeout_s=60")
    compose_run([*judge, "engine.unit_timeout_s=60", "task.judge.call_timeout_s=45"])
    compose_run(["engine.unit_timeout_s=60"])  # no judge: nothing to fit
