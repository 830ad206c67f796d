"""What `lr` means, strategy by strategy, and the labels that say so (issue 54, point 3).

Every strategy page states its update rule. The ES paper's step (Qiu et al. 2025, Algorithm 1 and
its countdown/es_fine-tuning_countdown.py) is theta <- theta + alpha / N sum_n z_n eps_n, where
member n is theta + sigma eps_n: per unit of noise, alpha / N. evora's ES-type strategies scale the
same sum differently (es and eggroll divide by sigma, es_full does not), so the paper's alpha is
`lr / sigma` under es and eggroll and `lr` itself under es_full: `ALPHA_OF`, which the first test
measures from the strategies' own code. A config that says it is the paper's (the qiu2025
experiments, the paper's Countdown runs; any comment that gives "the paper's" alpha or lr a value)
must compose to the paper's step."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from evora.lora.layout import AdapterLayout, ModuleSlot
from evora.plan.compose import CONF_DIR, compose_run
from evora.strategies import entries
from evora.strategies.eggroll import EggrollConfig, EggrollStrategy
from evora.strategies.es import ESConfig
from evora.strategies.es.strategy import EvolutionStrategy
from evora.strategies.es_full import EsFullConfig, EsFullStrategy
from evora.strategies.full_weights import matrix_name
from evora.strategies.protocol import StrategyContext, fitness_results

ROOT = Path(__file__).resolve().parents[2]
PAPER_ALPHA, PAPER_SIGMA, PAPER_N = 5e-4, 0.001, 30  # the paper's ALPHA, SIGMA, POPULATION_SIZE

# The paper's alpha that a strategy's settings amount to: its step per unit of noise, times N.
ALPHA_OF: dict[str, Callable[[Any], float]] = {
    "es": lambda s: s.lr / s.sigma,  # theta += lr / (N sigma) sum_i w_i eps_i
    "eggroll": lambda s: s.lr / s.sigma,  # W += lr / (N sigma) sum_i w_i E_i
    "es_full": lambda s: s.lr,  # W += lr / N sum_i z_i eps_i, the paper's own rule
}

SEED = 7
SLOT = ModuleSlot("model.layers.0.mlp.down_proj", 0, 5, 4)
LAYOUT = AdapterLayout((SLOT,), 1, 2.0, ("down_proj",), None, "tiny")
PAIR = fitness_results(0, np.array([1.0, -1.0]))  # one mirrored pair: the step is ALPHA_OF x the member's noise


def es_step(lr: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    es = EvolutionStrategy(ESConfig(population=2, sigma=sigma, lr=lr, antithetic=True), SEED)
    state = es.start({"t": torch.zeros(3, 4)})
    specs, payload = es.ask(state, 0)
    noise = (es.materialise(payload, specs[0])["t"] - state.theta["t"]) / sigma
    return es.tell(state, specs, PAIR).state.theta["t"] - state.theta["t"], noise


def es_full_step(lr: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    es = EsFullStrategy(EsFullConfig(population=2, sigma=sigma, lr=lr, antithetic=True), SEED)
    state = es.initial_state(StrategyContext(SEED, LAYOUT, "tiny"))
    specs, payload = es.ask(state, 0)
    name = matrix_name(SLOT.name)
    master = es.start_master({name: torch.zeros(SLOT.out_features, SLOT.in_features)})
    noise = (es.perturbed(master, payload, specs[0])[name] - master.tensors[name]) / sigma
    es.apply(master, es.update_of(es.tell(state, specs, PAIR).state, 0))
    return master.tensors[name].clone(), noise


def eggroll_step(lr: float, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    eggroll = EggrollStrategy(EggrollConfig(population=2, sigma=sigma, lr=lr), SEED)
    state = eggroll.initial_state(StrategyContext(SEED, LAYOUT, "tiny"))
    specs, payload = eggroll.ask(state, 0)
    lora = eggroll.materialise(payload, specs[0])
    noise = LAYOUT.scale * lora[SLOT.b_key] @ lora[SLOT.a_key] / sigma  # the candidate's weight change / sigma
    name = matrix_name(SLOT.name)
    master = eggroll.start_master({name: torch.zeros(SLOT.out_features, SLOT.in_features)})
    eggroll.apply(master, eggroll.update_of(eggroll.tell(state, specs, PAIR).state, 0))
    return master.tensors[name].clone(), noise


STEPS = {"es": (es_step, ESConfig), "es_full": (es_full_step, EsFullConfig), "eggroll": (eggroll_step, EggrollConfig)}


@pytest.mark.parametrize("name", sorted(ALPHA_OF))
def test_the_alpha_a_strategys_settings_amount_to_is_measured_from_its_code(name):
    step_of, config = STEPS[name]
    lr, sigma = 0.02, 0.1
    step, noise = step_of(lr, sigma)
    torch.testing.assert_close(step, ALPHA_OF[name](config(lr=lr, sigma=sigma)) * noise, rtol=1e-5, atol=1e-7)


def update_rule_section(page: Path) -> str:
    """The page's "## Update rule" section, to the next "## " heading."""
    found = re.search(r"^## Update rule\n(.*?)(?=^## |\Z)", page.read_text(), re.MULTILINE | re.DOTALL)
    return found.group(1) if found else ""


@pytest.mark.parametrize("name", sorted(e.name for e in entries() if e.config.__module__.startswith("evora.")))
def test_every_strategy_page_states_its_update_rule(name):
    section = update_rule_section(ROOT / "docs" / "strategies" / f"{name}.md")
    assert section, f"docs/strategies/{name}.md has no '## Update rule' section"
    assert "<-" in section or "←" in section, f"docs/strategies/{name}.md: the update rule states no formula"


def paper_step(run: Any) -> tuple[float, int, float]:
    """(the paper's alpha the run's settings amount to, N, sigma), after checking that its step is
    the paper's kind: z-scored fitness, plain SGD, independent members."""
    strategy = run.strategy
    settings = dataclasses.asdict(strategy)
    assert strategy.name in ALPHA_OF, f"{strategy.name}: no known relation to the paper's alpha"
    assert settings["shaping"] == "zscore" and settings.get("optimizer", "sgd") == "sgd"
    return ALPHA_OF[strategy.name](strategy), strategy.population, strategy.sigma


def own_command(path: Path) -> list[str]:
    """The overrides of the `# evora ...` line a conf file starts with (what it is run with)."""
    for line in path.read_text().splitlines():
        found = re.match(r"#\s+evora (.*?)(?:\s{2,}\(.*)?$", line)
        if found:
            return shlex.split(found.group(1))
    raise AssertionError(f"{path} names no evora command in its header")


# The paper's ES runs (its GRPO baselines: test_config's test of the qiu2025 GRPO experiments)
PAPER_RUNS = sorted(p for p in (CONF_DIR / "experiment" / "qiu2025").glob("*.yaml") if not p.stem.endswith("grpo"))


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_the_papers_countdown_runs_take_the_papers_step(path):
    run = compose_run(own_command(path))
    alpha, population, sigma = paper_step(run)
    assert (population, sigma, run.strategy.antithetic) == (PAPER_N, PAPER_SIGMA, False)
    assert alpha == pytest.approx(PAPER_ALPHA, rel=1e-9), f"{path.name}: {alpha / PAPER_ALPHA:g} x the paper's step"


NUMBER = r"(?P<value>\d[\d.]*(?:e[-+]?\d+)?)"
# "the ES paper's N=30, sigma=0.001, alpha=5e-4": a comment that gives the paper's alpha (or lr) a value ...
CLAIM = re.compile(r"paper's\b[^()\n]*?\b(?:alpha|lr)\b[ =:]*" + NUMBER)
# ... or an `lr:` key whose comment says it is "the paper's 5e-4"
LR_CLAIM = re.compile(r"^\s*lr:[^#]*#.*\bpaper's " + NUMBER, re.MULTILINE)


def claims(path: Path) -> list[float]:
    comments = "\n".join(line for line in path.read_text().splitlines() if "#" in line)
    return [float(m.group("value")) for pattern in (CLAIM, LR_CLAIM) for m in pattern.finditer(comments)]


def is_es_type(path: Path) -> bool:
    return compose_run(own_command(path)).strategy.name in ALPHA_OF


def claimed_configs() -> list[tuple[str, float]]:
    """(file, the alpha it gives the ES paper) for every claim in conf/ of an ES-type strategy (the
    others' "paper" is their own: SNES's eta_mu of 1 is no ES paper's alpha)."""
    paths = [*sorted((CONF_DIR / "strategy").glob("*.yaml")), *sorted((CONF_DIR / "experiment").rglob("*.yaml"))]
    found = [(path, value) for path in paths for value in claims(path)]
    return [(f"conf/{path.relative_to(CONF_DIR)}", value) for path, value in found if is_es_type(path)]


def test_the_claim_detector_reads_the_claims_it_is_meant_to():
    assert claims(CONF_DIR / "strategy" / "es_full.yaml") == [PAPER_ALPHA]  # "the paper's 5e-4" on its lr key
    header = "# evora strategy=es      (the ES paper's N=30, sigma=0.001, alpha=5e-4, on a LoRA's A and B)"
    assert [float(m.group("value")) for m in CLAIM.finditer(header)] == [PAPER_ALPHA]  # es.yaml's, before issue 54
    assert ("conf/strategy/es_full.yaml", PAPER_ALPHA) in claimed_configs()


@pytest.mark.parametrize(("path", "alpha"), claimed_configs())
def test_a_config_that_gives_the_papers_alpha_takes_the_papers_step(path, alpha):
    run = compose_run(own_command(ROOT / path))
    taken, _, _ = paper_step(run)
    assert taken == pytest.approx(alpha, rel=1e-9), (
        f"{path} says the paper's alpha is {alpha:g}; its {run.strategy.name} settings amount to {taken:g}"
    )
