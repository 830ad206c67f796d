"""The CLI's own process imports no torch: the strategy registry names its classes by import
path, the launcher starts the driver actor whose process imports the run loop
(`distributed/driver_actor.py`), and planning reads model sizes from safetensors headers. A
subcommand, a bad-input line or a run's launcher then answers without torch's seconds of import
(every run the suite makes pays them once less)."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "peft", "trl", "vllm", "matplotlib", "scipy", "pandas", "wandb")

IMPORTS = """
import sys
import evora.cli, evora.distributed.launch, evora.runs, evora.tracking.progress
import evora.commands.runs, evora.commands.compare, evora.commands.doctor
print(sorted(m for m in {heavy} if m in sys.modules))
"""

# Every strategy's checks, and the plans of those whose kind builds no strategy to size them (the
# full-weight kinds size their master copies from the strategy itself, torch and all), from the
# quickstart's configs: the tiny bundled model, its task.
PLANS = """
import sys
from evora.cli import main
from evora.plan.compose import setup
from evora.plan.jobs import preflight

setup()
for name in ("es", "ga", "snes", "pgpe", "randopt", "merge", "ecology", "sft", "grpo", "pbt"):
    preflight([f"+experiment=quickstart/{{name}}", "engine=hf"])
try:
    main(["strategy.sigma=-1"])
except SystemExit as stop:
    print("exit", stop.code)
print(sorted(m for m in {heavy} if m in sys.modules))
"""


def imported(probe: str) -> list[str]:
    command = [sys.executable, "-c", probe.format(heavy=HEAVY)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_the_cli_its_subcommands_and_the_launcher_import_no_torch():
    assert imported(IMPORTS) == ["[]"]


def test_planning_every_lora_strategys_run_and_refusing_bad_input_import_no_torch():
    assert imported(PLANS) == ["exit 2", "[]"]
