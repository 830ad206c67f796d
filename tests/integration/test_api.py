"""evora from Python (evora/api.py): `evora.run` runs a real job and returns the run it made,
`evora.load_run` reads any run folder into the same record (summary, metrics as a table, exports,
config), `evora.compose` gives the validated config; bad input raises the CLI's one-line error,
before anything starts where the CLI's preflight finds it, and from the job where it is found
on the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

import evora
from conftest import SMALL, shared_head
from evora.errors import ConfigError
from evora.tracking.metrics import read_metrics
from evora.tracking.summary import read_summary

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("api")]


@pytest.fixture(scope="module")
def joined(tmp_path_factory):
    """The job joins this process's shared Ray head, as conftest.run_evora's runs do."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in shared_head().environ.items():
            patch.setenv(key, value)
        yield tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def finished(joined) -> evora.Run:
    return evora.run(
        "+experiment=quickstart/es",
        *SMALL,
        "engine=hf",
        "generations=2",
        "hardware.num_workers=1",
        f"tracking.out_dir={joined}",
    )


def test_run_returns_the_run_it_made_and_load_run_reads_it_back(finished, joined, capsys):
    assert finished.path.parent == joined and finished.status == "finished"
    assert finished.config.generations == 2 and finished.config.strategy.population == 8
    assert finished.summary == read_summary(finished.path) and finished.summary["generations"] == 2
    assert list(finished.metrics["generation"]) == [r["generation"] for r in read_metrics(finished.path)]
    assert finished.metrics["generation"].max() == 2
    assert set(finished.adapters) == set(finished.summary["adapters"])
    assert (finished.adapters["best"] / "adapter_config.json").is_file()
    again = evora.load_run(str(finished.path))
    assert (again.path, again.config, again.summary, again.adapters) == (
        finished.path,
        finished.config,
        finished.summary,
        finished.adapters,
    )
    assert again.metrics.equals(finished.metrics)


def test_bad_input_raises_one_line_before_anything_starts(joined, tmp_path):
    with pytest.raises(ConfigError, match=r"^strategy.sigma=inf: must be a finite number"):
        evora.run("strategy.sigma=inf", f"tracking.out_dir={tmp_path}")
    with pytest.raises(ConfigError, match="evora.run runs one job"):
        evora.run("seed=0,1", f"tracking.out_dir={tmp_path}")
    assert not any(tmp_path.iterdir())  # no run folder, no process
    with pytest.raises(ConfigError, match="not a run folder"):
        evora.load_run(tmp_path)
    assert evora.compose("strategy=ga", "generations=5").strategy.name == "ga"


def test_what_the_cluster_refuses_is_raised_as_the_jobs_one_line(joined, capsys):
    with pytest.raises(ConfigError, match="hardware.num_workers=2: .*need 64 CPUs but the Ray cluster has"):
        evora.run("hardware.num_workers=2", "hardware.cpus_per_worker=32", f"tracking.out_dir={joined}")
    assert "evora: error: hardware.num_workers=2" in capsys.readouterr().out  # echoed as the job said it


def test_the_summary_is_none_until_the_run_finished(finished, tmp_path):
    """A run folder whose job did not finish (its summary not yet written) loads too."""
    crashed = Path(tmp_path / "crashed")
    crashed.mkdir()
    (crashed / "config.yaml").write_text((finished.path / "config.yaml").read_text())
    (crashed / "metrics.jsonl").write_text((finished.path / "metrics.jsonl").read_text())
    run = evora.load_run(crashed)
    assert run.summary is None and run.adapters == {} and run.status == "crashed"
    assert run.metrics.equals(finished.metrics)
