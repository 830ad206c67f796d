"""Every `evora ...` command printed in README.md, in the docs site's pages (docs/) and at the top
of every conf/ file composes and validates (docs/architecture.md, "Configuration")."""

import re
import shlex
import shutil
from pathlib import Path

import pytest

from evora.commands import evaluate
from evora.plan.compose import CONF_DIR
from evora.plan.jobs import preflight

ROOT = Path(__file__).resolve().parents[2]


def shell_block_lines(text: str) -> list[str]:
    """Lines inside ```bash / ```sh / ``` fences, a line ending in a backslash joined to the next."""
    lines, fence, pending = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif fence in ("", "bash", "sh", "console"):
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            lines.append(pending + line)
            pending = ""
    return lines


DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands() -> list[str]:
    """The commands of README.md and of the docs' pages."""
    commands = []
    lines = [line for document in DOCUMENTS for line in shell_block_lines(document.read_text())]
    for line in lines:
        line = line.split(" #")[0].strip()
        line = line.split(" -- ", 1)[1] if " -- evora" in line else line  # ray job submit ... -- evora
        line = line.removeprefix(".venv/bin/")
        line = launch_script_as_evora(line) or line
        line = line.replace("evora doctor ", "evora ", 1)  # doctor takes a run's overrides
        if re.match(r"^(\w+=\S+ )*evora( |$)", line) and not re.match(r"^evora (analyze|runs|compare|serve)\b", line):
            commands.append(line)  # analyze/runs/compare/serve take folders, not config: the CLI tests run them
    return commands


def launch_script_as_evora(line: str) -> str | None:
    """`launch/submit.sh [flags] <overrides>` -> `evora <overrides>`, `launch/sweep.sh <overrides>`
    -> `evora -m <overrides>`, `sbatch [flags] launch/slurm.sbatch <overrides>` -> `evora
    hardware=multinode <overrides>` (as the script runs it); None for other lines and for
    job-management calls."""
    words = line.split()
    if words[:1] == ["sbatch"] and "launch/slurm.sbatch" in words:  # sbatch [flags] launch/slurm.sbatch <overrides>
        overrides = words[words.index("launch/slurm.sbatch") + 1 :]
        if any(w.startswith("resume=") for w in overrides):
            return None  # a resume names a run folder of the user's
        chosen = any(w.startswith("hardware=") for w in overrides)
        return " ".join(["evora", *([] if chosen else ["hardware=multinode"]), *overrides])
    if not words or words[0] not in ("launch/submit.sh", "launch/sweep.sh"):
        return None
    if any(w in ("--logs", "--status", "--stop", "-h", "--help") for w in words):
        return None
    overrides = [w for w in words[1:] if "=" in w and not w.startswith("-")]
    return " ".join(["evora", *(["-m"] if words[0] == "launch/sweep.sh" else []), *overrides])


def conf_header_commands() -> list[str]:
    commands = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            match = re.match(r"#\s+(evora(?: [^(#]*)?)", line)
            if match:
                commands.append(match.group(1).strip())
    return commands


def test_there_are_commands_to_check():
    assert len(readme_commands()) >= 5
    assert sum(1 for c in readme_commands() if c.startswith("evora -m")) >= 2
    assert len(conf_header_commands()) >= len(list(CONF_DIR.rglob("*.yaml"))) - 3


# evora eval's own options (evora.commands.evaluate.EVAL_OPTIONS), as a prefix each.
EVAL_OPTIONS = tuple(f"{option}=" for option in evaluate.EVAL_OPTIONS)


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    """What the documents' placeholders stand for: the ES paper's countdown.json (a file of its
    shape and size: 2,200 records, string targets) and a finished run folder (`runs/<...>`)."""
    import json
    import random

    from conftest import make_summary
    from evora.tasks.builtin.countdown import generate_problem

    folder = tmp_path_factory.mktemp("placeholders")
    rng = random.Random(0)
    records = [generate_problem(rng) for _ in range(2200)]
    records = [{**r, "target": str(r["target"]), "context": f"Using the numbers {r['numbers']}..."} for r in records]
    (folder / "countdown.json").write_text(json.dumps(records))
    run = folder / "finished_run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "summary.json").write_text(json.dumps(make_summary(0.1, 0.5)))
    adapter = write_tiny_adapter(folder / "adapter")
    shutil.copytree(adapter, run / "adapters" / "best")
    return {"countdown.json": str(folder / "countdown.json"), "run": str(run), "adapter": str(adapter)}


def write_tiny_adapter(folder: Path) -> Path:
    """A rank-1 adapter of the tiny model's last down_proj: what `adapters/<...>` stands for."""
    from conftest import TINY
    from evora.lora.init import random_adapter
    from evora.lora.layout import build_layout
    from evora.lora.modules import adaptable_modules
    from evora.lora.peft_io import save_adapter

    layout = build_layout(
        adaptable_modules(str(TINY)), rank=1, alpha=1.0, target_modules=["down_proj"], layers=[1], base_model=str(TINY)
    )
    return save_adapter(folder, random_adapter(layout, 0, None, 0.01), layout)


def substitute(argv: list[str], placeholders: dict[str, str]) -> list[str]:
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if value == "countdown.json":
            arg = f"{key}={placeholders['countdown.json']}"
        elif re.fullmatch(r"runs/<[^>]+>", value):
            arg = f"{key}={placeholders['run']}"
        elif value.startswith("[") and "/<" in value:  # a list of adapters and runs: strategy.adapters
            items = [placeholders["run" if item.startswith("runs/") else "adapter"] for item in value[1:-1].split(",")]
            arg = f"{key}=[{','.join(items)}]"
        out.append(arg)
    return out


@pytest.mark.parametrize("command", sorted(set(readme_commands() + conf_header_commands())))
def test_documented_command_composes(command, monkeypatch, placeholders):
    words = shlex.split(command)
    while "=" in words[0]:  # environment assignments, e.g. PYTHONPATH=examples
        name, _, value = words.pop(0).partition("=")
        if name == "PYTHONPATH":
            monkeypatch.syspath_prepend(str(ROOT / value))
    argv = words[1:]
    if argv[:1] == ["eval"]:  # evora eval: its own options, then config overrides
        argv = [a for a in argv[1:] if not a.startswith(EVAL_OPTIONS)]
    argv = [a for a in argv if not a.startswith("resume=")]  # resume needs a real run folder
    argv = substitute(argv, placeholders)
    monkeypatch.chdir(ROOT)
    assert preflight(argv) or "--cfg" in argv
