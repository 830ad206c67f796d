"""`evora eval adapter=<run>/routing.json`: an ecology run's routed portfolio, evaluated again
from its files (the map and the organelles' PEFT adapters) with the run's config, scores on
held-out exactly what the run's finish measured (same split, greedy decoding, engine and work
units); with compare=true beside the base model. Bad routing files stop before Ray starts."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from conftest import TINY, cli_run, run_evora
from evora.lora.layout import build_layout
from evora.lora.peft_io import save_adapter

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eval-routing")]

# tiny_mix's four families; routing_confidence=0 lets specialists take families (a map with several members)
ECOLOGY = [
    "+experiment=quickstart/ecology_mix",
    "engine=hf",
    "generations=2",
    "eval_every=2",
    "hardware.num_workers=1",
    "strategy.routing_confidence=0",
]


@pytest.fixture(scope="module")
def ecology_run() -> Path:
    return cli_run(*ECOLOGY)[0]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "eval" / "summary.json").read_text())


def evaluate(run_dir: Path, cwd: Path, *options: str) -> dict:
    result = run_evora(["eval", f"adapter={run_dir / 'routing.json'}", *options, "hardware.num_workers=1"], cwd=cwd)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "routed portfolio reward" in result.stdout
    stem = "compare" if "compare=true" in options else "eval"
    return json.loads((run_dir / "eval" / "portfolio" / f"{stem}.json").read_text())


def test_the_routed_portfolio_scores_exactly_what_the_run_measured(ecology_run, tmp_path):
    details = summary_of(ecology_run)["details"]
    report = evaluate(ecology_run, tmp_path)
    portfolio = report["portfolio"]
    assert {k: portfolio[k] for k in ("reward", "accuracy", "tokens")} == details["portfolio"]
    assert report["adapter_metrics"] == details["portfolio"]  # the portfolio as one adapter
    assert portfolio["single_best"] == details["single_best"]
    assert portfolio["routing"] == details["routing"]
    families = portfolio["families"]
    assert set(families) == {"addition", "difference", "reversal", "letter_count"}
    assert all(
        f["member"] == details["routing"].get(name, details["routing"]["default"]) for name, f in families.items()
    )
    assert sum(f["examples"] for f in families.values()) == report["examples"] == 256
    assert sum(f["reward"] * f["examples"] for f in families.values()) / 256 == pytest.approx(portfolio["reward"])
    assert "## Routed portfolio" in (ecology_run / "eval" / "portfolio" / "eval.md").read_text()


def test_compare_puts_the_base_model_beside_the_portfolio(ecology_run, tmp_path):
    summary = summary_of(ecology_run)
    report = evaluate(ecology_run, tmp_path, "compare=true")
    assert report["portfolio"]["reward"] == summary["details"]["portfolio"]["reward"]
    assert report["base_metrics"]["reward"] == summary["base"]["reward"]
    assert sum(report["counts"].values()) == report["examples"]
    assert all("base_reward" in f for f in report["portfolio"]["families"].values())
    markdown = (ecology_run / "eval" / "portfolio" / "compare.md").read_text()
    assert "| family | member | examples | reward | accuracy | tokens | base reward |" in markdown
    assert markdown.index("## Routed portfolio") < markdown.index("Improvements (base wrong, adapter right)")


# --- bad routing files: one line naming the file, exit 2, before Ray starts ----------------------


def adapter_at(folder: Path, tiny_shapes: dict, rank: int = 1) -> None:
    layout = build_layout(
        tiny_shapes, rank=rank, alpha=1.0, target_modules=["down_proj"], layers=[1], base_model=str(TINY)
    )
    save_adapter(folder, {name: torch.zeros(shape) for name, shape in layout.shapes().items()}, layout)


@pytest.fixture
def members(tmp_path, tiny_shapes) -> Path:
    """A folder of member adapters for routing files to name: o0, o1 (one layout), rank2, empty."""
    for name, rank in (("o0", 1), ("o1", 1), ("rank2", 2)):
        adapter_at(tmp_path / "adapters" / name, tiny_shapes, rank)
    (tmp_path / "adapters" / "empty").mkdir()
    return tmp_path


def routing_file(folder: Path, content: dict | str | None) -> Path:
    path = folder / "routing.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


GOOD = {"routing": {"addition": "o1", "default": "o0"}, "adapters": {"o0": "adapters/o0", "o1": "adapters/o1"}}
LAYOUTS = (
    {**GOOD, "adapters": {"o0": "adapters/o0", "o1": "adapters/rank2"}},
    "members o0 and o1 have different layouts (rank 1 vs 2",
)


@pytest.mark.parametrize(
    "content,reason",
    [
        (None, "file not found"),
        ("{not json", "not JSON (Expecting property name"),
        ([1, 2], 'no "routing" map'),
        ({"adapters": GOOD["adapters"]}, 'no "routing" map'),
        ({"routing": GOOD["routing"]}, 'no "adapters" map'),
        ({**GOOD, "routing": {"addition": "o7", "default": "o0"}}, '"routing": addition -> o7: not one of its'),
        ({**GOOD, "routing": {"addition": "o1"}}, '"routing" has no "default" member'),
        (
            {**GOOD, "adapters": {"o0": "adapters/o0", "o1": "adapters/gone"}},
            'member o1: adapter folder "adapters/gone"',
        ),
        (
            {**GOOD, "adapters": {"o0": "adapters/o0", "o1": "adapters/empty"}},
            "member o1=",
        ),
        LAYOUTS,
    ],
)
def test_a_bad_routing_file_is_one_line_naming_it(content, reason, members, capsys):
    import ray

    from evora.cli import main

    routing, out = routing_file(members, content), members / "out"
    with pytest.raises(SystemExit) as exited:
        main(["eval", f"adapter={routing}", f"tracking.out_dir={out}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f'evora: error: adapter="{routing}": ') and reason in lines[0], lines[0]
    assert not ray.is_initialized() and not out.exists()


def test_a_bad_routing_file_stops_the_real_cli_before_ray_starts(members):
    routing, out = routing_file(members, LAYOUTS[0]), members / "out"
    ray_tmp = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))
    result = run_evora(
        ["eval", f"adapter={routing}", f"tracking.out_dir={out}"], cwd=members, env={"RAY_TMPDIR": str(ray_tmp)}
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'evora: error: adapter="{routing}": ') and LAYOUTS[1] in lines[0]
    assert not any(ray_tmp.iterdir()), "Ray was started"
    assert not out.exists(), "a report folder was created"
    shutil.rmtree(ray_tmp)


# --- benchmarks=[...] of a routing.json: lm-eval on its default member ----------------------------


def test_benchmarks_of_a_routing_file_load_its_default_member(members):
    from evora.jobs.benchmarks import export_folder, subjects
    from evora.plan.compose import compose_run

    routing = routing_file(members, {**GOOD, "routing": {"addition": "o0", "default": "o1"}})
    base, export = subjects(compose_run([]), export_folder(str(routing))[0])
    assert (base.pretrained, base.adapter) == (export.pretrained, None)
    assert (export.label, export.adapter) == ("adapter", str((members / "adapters" / "o1").resolve()))


def test_benchmarks_of_a_bad_routing_file_are_one_line_naming_it(members, capsys):
    from evora.cli import main

    routing = routing_file(members, {**GOOD, "routing": {"addition": "o1"}})
    with pytest.raises(SystemExit) as exited:
        main(["eval", f"adapter={routing}", "benchmarks=[evora_addition]", f"out={members / 'out'}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(lines) == 1, lines
    assert (
        lines[0]
        == f'evora: error: adapter="{routing}": "routing" has no "default" member (families it does not name go there)'
    )
