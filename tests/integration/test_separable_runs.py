"""strategy=snes and strategy=pgpe end to end through the CLI and Ray (the quickstart, shortened to
8 generations of 16 candidates): the held-out reward rises over the base model's, the spreads
moved and are recorded, and the exported mean adapter reloads in PEFT like its merged reference.
Their determinism (1 and N workers, killed workers, a restarted driver) is test_chaos.py's.
engine=hf: their candidates are LoRA tensors like ES's, whose way through vLLM is test_cli.py's."""

from __future__ import annotations

import json

import pytest
from test_model_families import assert_reloads_like_reference

from conftest import cli_run
from evora.tracking.metrics import read_metrics

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["snes", "pgpe"])
def test_the_quickstart_improves_and_its_adapter_loads_in_peft(strategy, tiny_path):
    short = ("generations=8", "eval_every=4", "strategy.population=16", "task.eval_size=128", "engine=hf")
    short += ("hardware.num_workers=1",)  # one engine process: the pool is test_chaos.py's
    run_dir, stdout = cli_run(f"+experiment=quickstart/{strategy}", *short)
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert summary["best"]["reward"] > summary["base"]["reward"] + 0.1, summary
    records = read_metrics(run_dir)[1:]
    assert all(0 < r["sigma_min"] <= r["sigma_mean"] <= r["sigma_max"] for r in records)
    assert records[-1]["sigma_mean"] != 0.3 and "sigma" in stdout  # adapted; on the console
    assert_reloads_like_reference(tiny_path, run_dir / "adapters" / "mean")
