"""The console's last lines come from the one summary, whatever the strategy."""

from conftest import make_summary
from evora.tracking.progress import final_lines, generation_line


def test_final_lines_of_an_es_and_a_pbt_run():
    es = final_lines({"summary": make_summary(0.5, 0.9, 0.85), "run_dir": "runs/x"})
    assert es[0] == "held-out reward: base model 0.500 -> final mean adapter 0.850 (best 0.900 at generation 3)"
    assert "3 improvements, 0 regressions" in es[1] and es[2].startswith("compute: 1e+09 FLOPs searching")
    pbt_summary = make_summary(
        0.4,
        0.7,
        strategy="pbt",
        best_generation=None,
        best_member="r8_lr0.001_d0.0_g2",
        details={
            "converged": None,
            "median_member_heldout_fitness": 0.6,
            "members": {"a": 0.6, "b": 0.7},
            "best_hyperparameters": {"rank": 8},
        },
    )
    pbt = final_lines({"summary": pbt_summary, "run_dir": "runs/y"})
    assert pbt[0] == "held-out reward: base model 0.400 (best 0.700, best member r8_lr0.001_d0.0_g2)"
    assert "converged: too few generations to tell" in pbt and "median member heldout fitness: 0.600" in pbt
    assert "best hyperparameters: {'rank': 8}" in pbt and not any(line.startswith("members") for line in pbt)
    assert pbt[-1] == "run folder: runs/y  (adapters/best: PEFT layout)"


def test_a_strategy_adds_its_own_fields_to_the_generation_line():
    event = {
        "generation": 2,
        "generations": 5,
        "reward_mean": 0.5,
        "reward_p20": 0.4,
        "reward_p80": 0.6,
        "reward_max": 0.9,
        "seconds": 1.25,
        "tokens_per_second": 1234.0,
        "update_norm": 0.0123,
    }
    line = generation_line(event, (("update_norm", "|update|"), ("absent", "nothing")))
    assert line == "gen    2/5  reward 0.500 [p20 0.400 p80 0.600 max 0.900]  |update| 0.012  1.2s  1,234 tok/s"


def test_a_job_whose_members_report_themselves_gets_no_generation_bar():
    import io

    from rich.console import Console

    from evora.tracking.progress import ConsoleProgress, members_report

    start = {"kind": "start", "strategy": "any", "generations": 4, "start": 0, "workers": 1, "resumed": False}
    start.update(base_heldout=None, adapter_parameters=None, setup_seconds=2.0)
    for population, bar in ((3, False), (None, True)):
        buffer = io.StringIO()
        with ConsoleProgress(console=Console(file=buffer, width=200)) as progress:
            progress.handle({**start, "population": population})
            assert (progress.task is not None) is bar and members_report({**start, "population": population}) is not bar
        assert ("3 members" in buffer.getvalue()) is not bar
