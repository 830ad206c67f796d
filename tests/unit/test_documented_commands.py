"""Every `evora ...` command printed in README.md, in the docs site's pages (docs/), at the top
of every conf/ file, in launch/'s and k8s/'s files and in examples/ composes and validates
(docs/architecture.md, "Configuration"), and runs the model its label names: a run called after a
shipped model config (`model.name`, so its run name and `evora compare`'s grouping) runs that
config's `model.path`, and a shipped config's checkpoint runs under its own name."""

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

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
    lines = [line for document in DOCUMENTS for line in shell_block_lines(document.read_text())]
    return [command for command in map(evora_command, lines) if command is not None]


def evora_command(line: str) -> str | None:
    """The evora command a shell line runs (a launch script's, `ray job submit ... -- evora`,
    `evora doctor`'s as a run's), or None: another program, a shell variable's expansion, or a
    command that takes folders or files, not config (analyze/runs/compare/serve/data: their own tests run them)."""
    line = line.split(" #")[0].strip()
    line = line.split(" -- ", 1)[1] if " -- evora" in line else line  # ray job submit ... -- evora
    line = line.removeprefix(".venv/bin/")
    line = launch_script_as_evora(line) or line
    line = line.replace("evora doctor ", "evora ", 1)  # doctor takes a run's overrides
    if "$" in line or not re.match(r"^(\w+=\S+ )*evora( |$)", line):
        return None
    return None if re.match(r"^evora (analyze|runs|compare|serve|data)\b", line) else line


SCRIPTS = sorted([*(ROOT / "launch").iterdir(), *(ROOT / "k8s").glob("*.yaml")])


def script_commands() -> list[str]:
    """What launch/'s scripts and k8s/'s manifests document: their usage comments and usage text,
    a RayJob's `entrypoint:`."""
    commands = []
    for path in SCRIPTS:
        for line in path.read_text().splitlines():
            text = line.strip().lstrip("#").strip().removeprefix("entrypoint:").strip()
            command = evora_command(text)
            if command is not None and all("=" in w or w.startswith("-") for w in command.split()[1:]):
                commands.append(command)  # not prose ("evora on whole SLURM nodes ...") nor a pattern ("<overrides>")
    return commands


def example_commands() -> list[str]:
    """The `evora ...` commands examples/' modules give in backticks, with PYTHONPATH=examples."""
    texts = [path.read_text() for path in sorted((ROOT / "examples").rglob("*.py"))]
    return [f"PYTHONPATH=examples {command}" for text in texts for command in re.findall(r"`(evora [^`]+)`", text)]


# A SLURM script -> the defaults it adds, by the job's node count, unless the overrides choose them.
SBATCH_DEFAULTS = {
    "launch/slurm.sbatch": lambda nodes: {"hardware": "multinode"},
    "launch/slurm_gpu.sbatch": lambda nodes: {"model": "qwen2_5_7b", "hardware": "gpu" if nodes == 1 else "multinode"},
}


def sbatch_as_evora(words: list[str]) -> str | None:
    """`sbatch [flags] launch/<script>.sbatch <overrides>` -> the evora command the script runs;
    None for a resume (it names a run folder of the user's)."""
    script = next(w for w in words if w in SBATCH_DEFAULTS)
    overrides = words[words.index(script) + 1 :]
    if any(w.startswith("resume=") for w in overrides):
        return None
    nodes = next((int(w.split("=")[1]) for w in words if w.startswith("--nodes=")), 1)
    defaults = [
        f"{k}={v}"
        for k, v in SBATCH_DEFAULTS[script](nodes).items()
        if not any(w.startswith(k + "=") for w in overrides)
    ]
    return " ".join(["evora", *defaults, *overrides])


def launch_script_as_evora(line: str) -> str | None:
    """`launch/submit.sh [flags] <overrides>` -> `evora <overrides>`, `launch/sweep.sh <overrides>`
    -> `evora -m <overrides>`, `sbatch [flags] launch/slurm.sbatch <overrides>` -> `evora
    hardware=multinode <overrides>` (as the script runs it); None for other lines and for
    job-management calls."""
    words = line.split()
    if words[:1] == ["sbatch"] and any(w in SBATCH_DEFAULTS for w in words):
        return sbatch_as_evora(words)
    if not words or words[0] not in ("launch/submit.sh", "launch/sweep.sh"):
        return None
    if any(w in ("--logs", "--status", "--stop", "-h", "--help") for w in words):
        return None
    if "--" in words:  # submit.sh [flags] -- <evora's arguments, -m included>
        return " ".join(["evora", *words[words.index("--") + 1 :]])
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


def documented_commands() -> list[str]:
    return sorted(set(readme_commands() + conf_header_commands() + script_commands() + example_commands()))


def test_there_are_commands_to_check():
    assert len(readme_commands()) >= 5
    assert sum(1 for c in readme_commands() if c.startswith("evora -m")) >= 2
    assert len(conf_header_commands()) >= len(list(CONF_DIR.rglob("*.yaml"))) - 3
    assert len(script_commands()) >= 8 and any(c.startswith("evora -m") for c in script_commands())
    assert "evora hardware=multinode tracking=wandb" in " ".join(script_commands())  # k8s/rayjob.yaml's entrypoint
    assert len(example_commands()) >= 3


SHIPPED_MODELS = {  # model.name -> model.path of every shipped model config
    config["name"]: config["path"]
    for config in (yaml.safe_load(path.read_text()) for path in sorted((CONF_DIR / "model").glob("*.yaml")))
    if "name" in config
}


def mislabelled(model) -> str | None:
    """Why a run's model label is another model's (None when it is not)."""
    for name, path in SHIPPED_MODELS.items():
        if model.name == name and model.path != path:
            return f"labelled model.name={name} (conf/model/{name}.yaml: {path}) but runs model.path={model.path}"
        if model.path == path and model.name != name:
            return f"runs {path} (conf/model/{name}.yaml) labelled model.name={model.name}"
    return None


def test_the_label_check_tells_a_relabelled_checkpoint():
    from evora.plan.compose import compose_run

    experiment = "+experiment=qiu2025/countdown_llama3_2_1b_es_full"
    assert mislabelled(compose_run([experiment, "hardware=gpu"]).model) is None
    relabelled = compose_run([experiment, "model.path=meta-llama/Llama-3.2-3B-Instruct", "hardware=gpu"]).model
    assert "labelled model.name=llama3_2_1b" in mislabelled(relabelled)
    assert "labelled model.name=tiny" in mislabelled(compose_run(["model.path=Qwen/Qwen2.5-7B-Instruct"]).model)


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


# A reasoning_gym command's problems at sizes that generate in a second (what is checked here is
# that it composes and plans; tests/integration/test_reasoning_gym_run.py runs the datasets).
GYM_SIZES = ["task.train_size=128", "task.eval_size=8", "task.selection_size=8"]


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


@pytest.mark.parametrize("command", documented_commands())
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
    if "task=reasoning_gym" in argv:  # its problems are generated in preflight: 2,432 Countdown ones took 35 s
        argv += GYM_SIZES
    monkeypatch.chdir(ROOT)
    composed = preflight(argv)
    assert composed or "--cfg" in argv
    assert [problem for problem in (mislabelled(run.model) for run in composed) if problem] == []
