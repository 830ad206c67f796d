"""The `evora` command: Hydra main over conf/, with a preflight that rejects bad input in
one line before Ray starts.

    evora                                   the quickstart (tiny model, CPU, local Ray)
    evora model=qwen2_5_0_5b task=countdown hardware=gpu
    evora -m strategy.sigma=0.001,0.002 seed=0,1,2
    evora resume=runs/<run folder> generations=60
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from evora.config.compose import CONF_DIR, preflight, setup, to_run_config
from evora.config.validate import validate
from evora.errors import EvoraError

EXIT_BAD_INPUT = 2


def _die(error: EvoraError) -> None:
    print(f"evora: error: {error}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """One job: validated config -> driver on Ray -> final summary."""
    try:
        run = to_run_config(cfg)
        validate(run)
        if run.resume is not None:
            from evora.config.resume import resumed_run_config

            run = resumed_run_config(run, list(HydraConfig.get().overrides.task))
    except EvoraError as error:
        _die(error)
    from evora.distributed.launch import launch
    from evora.tracking.progress import ConsoleProgress

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        with ConsoleProgress(enabled=run.tracking.progress) as progress:
            return launch(run, run_dir, progress.handle)
    except EvoraError as error:
        _die(error)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_main(cfg: DictConfig) -> dict[str, Any]:
    return run_job(cfg)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    setup()
    try:
        preflight(argv)
    except EvoraError as error:
        _die(error)
    sys.argv = [sys.argv[0], *argv]
    _hydra_main()


if __name__ == "__main__":
    main()
