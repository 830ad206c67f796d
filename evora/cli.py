"""The `evora` command: Hydra main over conf/, with a preflight that rejects bad input in
one line before Ray starts.

    evora +experiment=quickstart/es         the quickstart, `make run` (tiny model, CPU, local Ray)
    evora model=qwen2_5_0_5b task=countdown hardware=gpu
    evora -m strategy.sigma=0.001,0.002 seed=0,1,2
    evora resume=runs/<run folder> generations=60
    evora eval adapter=runs/<run folder>/adapters/best compare=true
    evora analyze runs/<run folder>           plots/ and report.md (a sweep folder: sweep.png)
    evora compare runs/<run> runs/<run> ...   held-out reward, KL and compute, side by side
    evora runs list | show <run> | clean [--keep N] [--yes]   (clean: also dead runs' scratch)
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from evora.errors import ConfigError, EvoraError
from evora.plan.compose import CONF_DIR, resolve_named_overrides, setup, to_run_config
from evora.plan.jobs import job_plan, preflight
from evora.strategies import get_strategy
from evora.tracking.events import Event, OnEvent
from evora.tracking.run_dir import CLI_LOG, log_traceback
from evora.tracking.sweep import in_multirun, job_objective, with_sweep_tracking

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def _die(error: EvoraError) -> NoReturn:
    print(f"evora: error: {error}", file=sys.stderr)
    raise SystemExit(error.exit_code)


def _fail(error: BaseException, run_dir: Path) -> NoReturn:
    """One line on the console; the whole traceback in the run folder's cli.log."""
    trace = log_traceback(run_dir, error)
    if os.environ.get("EVORA_DEBUG") == "1":
        print(trace, file=sys.stderr, end="")
    if isinstance(error, EvoraError):
        _die(error)
    cause = getattr(error, "cause", None)  # a Ray task error: the exception raised on the cluster
    shown = cause if isinstance(cause, BaseException) else error
    first = (str(shown).strip().splitlines() or [""])[0][:300]
    print(f"evora: error: {type(shown).__name__}: {first} (traceback: {run_dir / CLI_LOG})", file=sys.stderr)
    raise SystemExit(EXIT_FAILURE)


class Terminated(BaseException):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the run stops the same way."""


# Interrupts the CLI's handlers raised. A signal that lands inside one of Ray's Cython calls can
# be swallowed there (reported as unraisable), and the run would go on: the next event re-raises it.
_PENDING: list[BaseException] = []


def _raise_interrupt(signum: int, frame: Any) -> None:
    interrupt = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    _PENDING.append(interrupt)
    raise interrupt


def _install_interrupt_handlers() -> None:
    signal.signal(signal.SIGTERM, _raise_interrupt)  # kept by init_ray over Ray's own handler
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell ignores it (background)
        signal.signal(signal.SIGINT, _raise_interrupt)


def _checked(on_event: OnEvent) -> OnEvent:
    """on_event that first raises an interrupt swallowed since the last event."""

    def handle(event: Event) -> None:
        if _PENDING:
            raise _PENDING[-1]
        on_event(event)

    return handle


def _interrupted(error: BaseException, run_dir: Path) -> NoReturn:
    """The run stopped at once; its last checkpoint stays. Says how to go on."""
    from evora.tracking.checkpoint import saved_generation

    done = saved_generation(run_dir)
    where = f" after generation {done}" if done is not None else ""  # PBT keeps Tune's checkpoints
    print(f"evora: interrupted{where}; resume: evora resume={run_dir}", file=sys.stderr)
    raise SystemExit(128 + (signal.SIGTERM if isinstance(error, Terminated) else signal.SIGINT))


def run_job(cfg: DictConfig) -> Event:
    """One job: its run plan (the preflight's) -> driver on Ray -> final summary."""
    try:
        plan = job_plan(to_run_config(cfg), list(HydraConfig.get().overrides.task), validated=False)
        plan = plan.with_run(with_sweep_tracking(plan.run))
    except EvoraError as error:
        _die(error)
    run = plan.run
    from evora.distributed.launch import launch
    from evora.runs import run_lock
    from evora.tracking.progress import ConsoleProgress

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    _install_interrupt_handlers()
    try:
        # run.lock tells `evora runs` this folder is live (and keeps `runs clean` off it).
        extra = get_strategy(run.strategy.name).console_keys
        with run_lock(run_dir), ConsoleProgress(enabled=run.tracking.progress, extra=extra) as progress:
            return launch(plan, str(run_dir), _checked(progress.handle))
    except (KeyboardInterrupt, Terminated) as error:
        _interrupted(error, run_dir)
    except Exception as error:
        interrupt = _interrupt_in(error)
        if interrupt is not None:
            _interrupted(interrupt, run_dir)
        _fail(error, run_dir)


def _interrupt_in(error: BaseException) -> BaseException | None:
    """An interrupt that reached us wrapped: raised by the signal handler inside one of Ray's
    Cython calls, it comes back as a SystemError whose cause is the interrupt."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (KeyboardInterrupt, Terminated)):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> Event | float:
    """A job; in a multirun its value is the run's `objective`, which hydra/sweeper=optuna optimises."""
    event = run_job(cfg)
    if not in_multirun():
        return event
    return job_objective(HydraConfig.get().runtime.output_dir, cfg.objective)


EVAL_OPTIONS = {
    "adapter": "a PEFT adapter folder, a run's routing.json (its routed portfolio), or base",
    "compare": "true | false",
    "split": "heldout | selection | train",
    "out": "report folder",
    "benchmarks": "lm-evaluation-harness tasks, e.g. [gsm8k,arc_easy]: the export against the base model",
    "benchmarks_path": "a folder of your own lm-eval task YAMLs (lm-eval's include_path)",
    "limit": "benchmarks: at most this many documents per task",
    "num_fewshot": "benchmarks: examples before each document (default: each task's own)",
    "apply_chat_template": "benchmarks: true | false, the model's chat template around each prompt",
    "log_samples": "benchmarks: true | false, each document's prompt, answers and metrics in samples_*.jsonl",
}


def _owner_run(adapter: str | None) -> Path | None:
    """The run folder (with its config.yaml) an adapter (<run>/adapters/<name>) or a routing
    file (<run>/routing.json) comes from; None elsewhere."""
    if adapter is None:
        return None
    path = Path(adapter)
    if path.name.endswith(".json"):
        owner = path.parent
    elif path.parent.name == "adapters" and len(path.parents) > 1:
        owner = path.parents[1]
    else:
        return None
    return owner if (owner / "config.yaml").is_file() else None


def eval_main(argv: list[str]) -> None:
    """`evora eval adapter=<dir|routing.json|base> [compare=true] [split=heldout] [out=<dir>] [config overrides]`.

    An adapter inside a run folder (<run>/adapters/<name>), or a run's routing.json, is
    evaluated with that run's config (model, task, seed), overrides applied on top; elsewhere
    with the defaults. A routing.json is evaluated as its routed portfolio. benchmarks=[a,b]: lm-eval's tasks."""
    from datetime import datetime

    from evora.plan.compose import compose_run
    from evora.plan.overlay import overlay, saved_run_config

    options = {k: v for k, _, v in (a.partition("=") for a in argv) if k in EVAL_OPTIONS}
    overrides = [a for a in argv if a.partition("=")[0] not in EVAL_OPTIONS]
    try:
        if "adapter" not in options:
            raise ConfigError("adapter: required, e.g. evora eval adapter=runs/<run>/adapters/best (or adapter=base)")
        compare = options.get("compare", "false").lower()
        if compare not in ("true", "false"):
            raise ConfigError(f"compare={compare}: allowed: true, false")
        split = options.get("split", "heldout")
        if split not in ("heldout", "selection", "train"):
            raise ConfigError(f"split={split}: allowed: heldout, selection, train")
        adapter = None if options["adapter"] == "base" else str(Path(options["adapter"]).resolve())
        routed = adapter is not None and adapter.endswith(".json")
        owner = _owner_run(adapter)
        run = overlay(saved_run_config(owner), overrides) if owner else compose_run(overrides)
        stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        name = "portfolio" if routed else Path(adapter or "base").name
        out = options.get("out") or str(
            owner / "eval" / name if owner else Path(run.tracking.out_dir) / f"{stamp}_eval"
        )
        from evora.distributed.eval_job import run_evaluation, run_portfolio_evaluation

        if "benchmarks" in options:
            from evora.jobs.benchmarks import benchmark, benchmark_environment

            os.environ.update(benchmark_environment(run))
            return print(Path(benchmark(run, adapter, options, Path(out))["paths"][0]).read_text(), end="")
        plan = job_plan(run, overrides)
        if routed:
            assert adapter is not None
            report = run_portfolio_evaluation(plan, adapter, compare == "true", split, out)
        else:
            report = run_evaluation(plan, adapter, compare == "true", split, out)
    except EvoraError as error:
        _die(error)
    _print_eval(report)


def _print_eval(report: dict[str, Any]) -> None:
    adapter_metrics = report["adapter_metrics"]
    if "base_metrics" in report:
        base, counts = report["base_metrics"], report["counts"]
        print(
            f"{report['split']} accuracy: base model {base['accuracy']:.3f} -> "
            f"adapter {adapter_metrics['accuracy']:.3f}"
            f" ({counts['improvements']} improvements, {counts['regressions']} regressions, "
            f"{counts['both_wrong']} both wrong, of {report['examples']})"
        )
    else:
        print(f"{report['split']}: " + ", ".join(f"{k} {v:.3f}" for k, v in adapter_metrics.items()))
    if "portfolio" in report:  # a routed portfolio: who served which family, and how well
        section = report["portfolio"]
        served = ", ".join(
            f"{f or '(none)'} -> {m['member']} {m['reward']:.3f}" for f, m in section["families"].items()
        )
        single = section["single_best"]
        print(
            f"routed portfolio reward {section['reward']:.3f} ({served}); "
            f"single best {single['id']} {single['reward']:.3f}"
        )
    print("reports: " + ", ".join(report["paths"]))


def analyze_main(argv: list[str]) -> None:
    """`evora analyze <run or sweep folder>`: plots + report.md; prints the paths."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="evora analyze", description=analyze_main.__doc__)
    parser.add_argument("folder", help="a run folder, or a multirun sweep folder (with sweep_summary.json)")
    args = parser.parse_args(argv)
    try:
        folder = Path(args.folder)
        if not folder.is_dir():
            raise ConfigError(f"{folder}: no such folder")
        from evora.analysis.report import analyze

        paths = analyze(folder)
    except EvoraError as error:
        _die(error)
    print("\n".join(str(p) for p in paths))


def compare_main(argv: list[str]) -> None:
    """`evora compare <run or sweep folder> ... [--out D]`: a table, compare.md/.json and plots/
    (compare.png: reward against compute; reward_kl.png: the reward-KL plane)."""
    import argparse

    from evora.analysis.compare import compare, print_table

    parser = argparse.ArgumentParser(prog="evora compare", description=compare_main.__doc__)
    parser.add_argument("folders", nargs="+", help="run folders, or multirun sweep folders")
    parser.add_argument("--out", default=None, help="where compare.md and plots/ go")
    args = parser.parse_args(argv)
    try:
        rows, paths = compare(args.folders, args.out)
    except EvoraError as error:
        _die(error)
    print_table(rows)
    print("\n".join(str(p) for p in paths))


def runs_main(argv: list[str]) -> None:
    """`evora runs list [--dir D] | show <run> | clean [--keep N] [--yes] [--dir D] [--scratch /dev/shm]`."""
    import argparse

    from evora import runs

    parser = argparse.ArgumentParser(prog="evora runs", description=runs_main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list").add_argument("--dir", default="runs")
    commands.add_parser("show").add_argument("run")
    clean = commands.add_parser("clean", help="delete old run folders, and scratch folders of dead runs")
    clean.add_argument("--keep", type=int, default=None, help="keep the N newest finished runs (omit: delete none)")
    clean.add_argument("--yes", action="store_true")
    clean.add_argument("--dir", default="runs")
    clean.add_argument("--scratch", default=runs.SCRATCH_ROOT, help="candidate adapters' folder (engine.adapter_dir)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            runs.print_runs(args.dir)
        elif args.command == "show":
            runs.show_run(args.run)
        else:
            if args.keep is not None:
                deleted = runs.clean_runs(args.dir, args.keep, args.yes)
                print("\n".join(f"deleted {run}" for run in deleted))
            swept = runs.sweep_dead_scratch(args.scratch)
            print(f"removed {swept} scratch folder(s) of runs no longer alive ({args.scratch}/evora-*)")
    except EvoraError as error:
        _die(error)


def doctor_main(argv: list[str]) -> None:
    """evora doctor [overrides]: the model, engines, layout and memory of a run, before Ray."""
    from evora.doctor import doctor

    try:
        code = doctor(argv)
    except EvoraError as error:
        _die(error)
    raise SystemExit(code)


def serve_main(argv: list[str]) -> None:
    """`evora serve <run folder> [--host H] [--port N] [--print] [-- vLLM flags]` (evora/serve.py)."""
    from evora.serve import serve

    try:
        serve(argv)
    except EvoraError as error:
        _die(error)


SUBCOMMANDS = {
    "analyze": analyze_main,
    "compare": compare_main,
    "runs": runs_main,
    "doctor": doctor_main,
    "serve": serve_main,
}


# Ray Tune (PBT) reads these in the process that runs it, the CLI's: no console tables or
# snapshot warnings of its own, and no result files of its own (evora prints one line per
# result and writes trials.jsonl). A user's own settings are kept.
TUNE_ENVIRONMENT = {
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup()
    for name, value in TUNE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if argv[:1] in (["--help"], ["-h"], ["help"]):
        from evora.help import help_text

        print(help_text())
        return
    if argv[:1] == ["eval"]:
        if set(argv[1:2]) & {"--help", "-h"}:
            print(eval_main.__doc__)
            return
        eval_main(argv[1:])
        return
    if argv[:1] and argv[0] in SUBCOMMANDS:
        SUBCOMMANDS[argv[0]](argv[1:])
        return
    try:
        argv = resolve_named_overrides(argv)  # a user's strategy or task by import path -> <group>=<its name>
        preflight(argv)
    except EvoraError as error:
        _die(error)
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
