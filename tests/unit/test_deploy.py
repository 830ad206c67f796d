"""Deployment files: launch/ scripts, docker/ images and k8s/ manifests.

The KubeRay manifests are validated against the RayCluster and RayJob CRD schemas (made
strict: an unknown key fails, as `kubectl apply` rejects it), every evora command the
scripts print or document composes with the preflight, submit.sh keeps secrets out of the
repository and off the command line, the Dockerfiles install what `make` installs, and one
slow test starts a real two-node cluster with launch/local_cluster.sh and stops only it."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import free_port
from evora.plan.jobs import preflight

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch"
SCRIPTS = sorted(LAUNCH.glob("*.sh"))
K8S = ROOT / "k8s"
CRD_DIR = ROOT / "tests" / "data" / "k8s-schemas"  # KubeRay's CRDs (see its README.md), shipped with the tests
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
RAY = Path(sys.executable).parent / "ray"
SECRET = "fake-key-123"
SECRET_NAME = re.compile(r"(^|_)(KEY|TOKEN|SECRET|PASSWORD)(_|$)")  # WANDB_API_KEY, HF_TOKEN; not TOKENIZERS_...


def load_yaml(path: Path) -> list[dict]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are megabytes of YAML
    with open(path) as f:
        return [doc for doc in yaml.load_all(f, Loader=loader) if doc]


def manifests(kind: str) -> list[dict]:
    return [doc for path in sorted(K8S.glob("*.yaml")) for doc in load_yaml(path) if doc.get("kind") == kind]


# --- k8s manifests against the KubeRay CRDs ----------------------------------------------


def strict(schema):
    """The schema with additionalProperties: false wherever it lists properties and allows
    nothing else, so that a misspelt key fails (the API server's strict field validation)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        k: strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf", "not") else v
        for k, v in schema.items()
    }
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validators() -> dict[str, jsonschema.Draft7Validator]:
    out = {}
    for kind, name in CRD_FILES.items():
        (crd,) = load_yaml(CRD_DIR / name)
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = strict(v1["schema"]["openAPIV3Schema"])
        jsonschema.Draft7Validator.check_schema(schema)
        out[kind] = jsonschema.Draft7Validator(schema)
    return out


def test_there_are_manifests():
    assert len(manifests("RayCluster")) == 1 and len(manifests("RayJob")) == 1
    assert len(manifests("PersistentVolumeClaim")) == 1


@pytest.mark.parametrize("kind", sorted(CRD_FILES))
def test_manifest_matches_crd(kind, validators):
    for doc in manifests(kind):
        assert doc["apiVersion"] == "ray.io/v1"
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validators[kind].iter_errors(doc)]
        assert not errors, errors


def _no_group_name(doc):
    del doc["spec"]["workerGroupSpecs"][0]["groupName"]


def _replicas_in_words(doc):
    doc["spec"]["workerGroupSpecs"][0]["replicas"] = "two"


def _misspelt_key(doc):
    doc["spec"]["workerGroupSpecs"][0]["minReplica"] = doc["spec"]["workerGroupSpecs"][0].pop("minReplicas")


def _gpu_in_words(doc):
    container = doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "one"


def _volume_without_name(doc):
    del doc["spec"]["headGroupSpec"]["template"]["spec"]["volumes"][0]["name"]


@pytest.mark.parametrize(
    "break_it", [_no_group_name, _replicas_in_words, _misspelt_key, _gpu_in_words, _volume_without_name]
)
def test_broken_raycluster_fails(break_it, validators):
    broken = copy.deepcopy(manifests("RayCluster")[0])
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        validators["RayCluster"].validate(broken)


def test_broken_rayjob_fails(validators):
    job = manifests("RayJob")[0]
    for change in ({"entrypoint": ["evora"]}, {"shutdownAfterJobFinishes": "yes"}, {"entrypiont": "evora"}):
        broken = copy.deepcopy(job)
        broken["spec"].update(change)
        with pytest.raises(jsonschema.ValidationError):
            validators["RayJob"].validate(broken)


def test_rayjob_cluster_is_the_raycluster():
    assert manifests("RayJob")[0]["spec"]["rayClusterSpec"] == manifests("RayCluster")[0]["spec"]


def pods(cluster_spec: dict) -> list[dict]:
    return [cluster_spec["headGroupSpec"]["template"]["spec"]] + [
        group["template"]["spec"] for group in cluster_spec["workerGroupSpecs"]
    ]


def test_cluster_pods_share_the_runs_volume():
    (claim,) = manifests("PersistentVolumeClaim")
    assert "ReadWriteMany" in claim["spec"]["accessModes"]  # head and workers on different nodes
    spec = manifests("RayCluster")[0]["spec"]
    for pod in pods(spec):
        volumes = {v["name"]: v for v in pod["volumes"]}
        (container,) = pod["containers"]
        assert container["image"] == "evora:gpu"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert set(mounts.values()) <= set(volumes)
        assert volumes[mounts["/runs"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"  # adapters go to /dev/shm
        assert pod["securityContext"]["runAsNonRoot"] is True
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) == 1
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_wandb_key_comes_from_a_secret():
    head = manifests("RayCluster")[0]["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in head["env"]}
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] | {"optional": True} == {
        "name": "wandb",
        "key": "api-key",
        "optional": True,
    }
    for path in [*K8S.glob("*.yaml"), *LAUNCH.iterdir()]:
        for doc_env in re.findall(r"name: (\w+)\n\s+value: (\S+)", path.read_text()):
            assert not SECRET_NAME.search(doc_env[0]), (path, doc_env)


def test_ray_version_matches_the_installed_ray():
    assert manifests("RayCluster")[0]["spec"]["rayVersion"] == version("ray")


def test_rayjob_entrypoint_composes_without_starting_ray(monkeypatch):
    import ray

    job = manifests("RayJob")[0]["spec"]
    words = shlex.split(job["entrypoint"])
    assert words[0] == "evora"

    def no_ray(*args, **kwargs):
        raise AssertionError("preflight must not start or join Ray")

    monkeypatch.setattr(ray, "init", no_ray)
    monkeypatch.chdir(ROOT)
    (run,) = preflight(words[1:])
    assert run.hardware.name == "multinode" and run.hardware.address == "auto"
    assert run.tracking.out_dir == "/runs" and run.tracking.name == "wandb"
    assert not ray.is_initialized()
    runtime_env = yaml.safe_load(job["runtimeEnvYAML"])
    assert runtime_env["env_vars"] == yaml.safe_load((LAUNCH / "runtime_env.yaml").read_text())["env_vars"]


# --- launch/ scripts ---------------------------------------------------------------------


def test_runtime_env_is_valid_and_has_no_secrets():
    from ray.runtime_env import RuntimeEnv

    env = yaml.safe_load((LAUNCH / "runtime_env.yaml").read_text())
    RuntimeEnv(**env)  # Ray's own check of the fields
    assert all(isinstance(v, str) for v in env["env_vars"].values())  # Ray wants strings
    assert not [k for k in env["env_vars"] if SECRET_NAME.search(k)]
    assert {".git/", ".venv/", "runs/"} <= set(env["excludes"])
    assert "working_dir" not in env  # given on the command line (--working-dir .)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_is_executable(script):
    assert script.stat().st_mode & stat.S_IXUSR, f"chmod +x {script.relative_to(ROOT)}"
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def sweep_default() -> list[str]:
    (line,) = re.findall(r"^\s*set -- (.+?)(?:\s+#.*)?$", (LAUNCH / "sweep.sh").read_text(), re.M)
    return shlex.split(line)


SUBMIT_FLAGS_WITH_VALUE = {"--address"}
SUBMIT_JOB_ACTIONS = {"--logs", "--status", "--stop", "-h", "--help"}


def evora_argv(line: str) -> list[str] | None:
    """The evora arguments of one documented command line, or None when it runs no evora."""
    words = shlex.split(line)
    while words and re.match(r"^\w+=", words[0]):  # environment assignments
        words.pop(0)
    program, args = Path(words[0]).name, words[1:]
    if program == "evora":
        return args
    if program == "sweep.sh":
        return None if args[:1] in (["-h"], ["--help"]) else ["-m", *(args or sweep_default())]
    argv, skip = [], False  # submit.sh: its own flags, then evora's arguments
    for i, word in enumerate(args):
        if skip:
            skip = False
        elif word in SUBMIT_JOB_ACTIONS:
            return None
        elif word in SUBMIT_FLAGS_WITH_VALUE:
            skip = True
        elif word == "--":
            return argv + args[i + 1 :]
        elif word not in ("--no-wait", "--dry-run"):
            argv.append(word)
    return argv


COMMAND = re.compile(r"^(\w+=\S+ +)*(launch/submit\.sh|launch/sweep\.sh|evora)( |$)")


def documented_commands(text: str) -> list[str]:
    """Command lines in comments, help text and printed examples: `evora ...`,
    `launch/submit.sh ...`, `launch/sweep.sh ...`. Usage synopses ([--flag], <...>, a|b)
    and lines with shell expansions are not literal commands and are left out."""
    commands = []
    for line in text.splitlines():
        line = re.sub(r"^\s*#", "", line).strip()
        line = re.split(r"\s+#\s", line)[0].strip()
        if COMMAND.match(line) and not re.search(r"\[--|<|\||\$", line):
            commands.append(line)
    return commands


def script_commands() -> list[tuple[str, str]]:
    return [(script.name, line) for script in SCRIPTS for line in documented_commands(script.read_text())]


def script_runs() -> list[tuple[str, str]]:
    """The documented commands that run evora (not job logs, status, stop or help)."""
    return [(name, line) for name, line in script_commands() if evora_argv(line) is not None]


def test_scripts_document_commands():
    by_script = {}
    for name, line in script_commands():
        by_script.setdefault(name, []).append(line)
    assert len(by_script.get("submit.sh", [])) >= 6
    assert len(script_runs()) >= 12
    assert len(by_script.get("sweep.sh", [])) >= 3
    assert len(by_script.get("local_cluster.sh", [])) >= 2
    assert "launch/sweep.sh" in by_script["sweep.sh"]  # the default sweep is checked too


@pytest.mark.parametrize("name,line", script_runs(), ids=[f"{name}: {line}" for name, line in script_runs()])
def test_script_command_composes(name, line, monkeypatch):
    argv = evora_argv(line)
    monkeypatch.chdir(ROOT)
    assert preflight(argv) or "--cfg" in argv


def submit(*args: str, env: dict | None = None, tmp: Path) -> subprocess.CompletedProcess:
    """launch/submit.sh with a clean environment: no address, no secrets, TMPDIR in tmp."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "WANDB_API_KEY", "HF_TOKEN")
    }
    return subprocess.run(
        [str(LAUNCH / "submit.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "TMPDIR": str(tmp), **(env or {})},
        cwd=tmp,
    )


def test_submit_dry_run_prints_the_command(tmp_path):
    result = submit("--dry-run", "--address", "http://127.0.0.1:8265", "model=tiny", "generations=2", tmp=tmp_path)
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip()
    for part in (
        "ray job submit",
        "--address http://127.0.0.1:8265",
        "--working-dir .",
        "--runtime-env launch/runtime_env.yaml",
        "-- evora model=tiny generations=2",
    ):
        assert part in command
    assert command.endswith("-- evora model=tiny generations=2")
    overrides = shlex.split(command.split(" -- evora", 1)[1])
    assert preflight(overrides)


def test_submit_reads_ray_address_and_job_actions(tmp_path):
    result = submit("--dry-run", "--no-wait", "seed=1", env={"RAY_ADDRESS": "http://head:8265"}, tmp=tmp_path)
    assert "--address http://head:8265 --no-wait" in result.stdout
    for flag, expected in (
        ("--logs", "ray job logs --address http://head:8265 --follow raysubmit_1"),
        ("--status", "ray job status --address http://head:8265 raysubmit_1"),
        ("--stop", "ray job stop --address http://head:8265 raysubmit_1"),
    ):
        result = submit("--dry-run", flag, "raysubmit_1", env={"RAY_ADDRESS": "http://head:8265"}, tmp=tmp_path)
        assert result.returncode == 0 and expected in result.stdout, result.stderr


def test_submit_without_address_fails_in_one_line(tmp_path):
    result = submit("model=tiny", tmp=tmp_path)
    assert result.returncode != 0
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert "RAY_ADDRESS" in result.stderr


def files_containing(text: str, root: Path, since: float) -> list[Path]:
    """Files under root written since `since` that contain text (.venv left out)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".venv"]
        for name in filenames:
            path = Path(dirpath, name)
            try:
                if path.stat().st_mtime >= since and text.encode() in path.read_bytes():
                    found.append(path)
            except OSError:
                pass
    return found


def test_submit_dry_run_masks_secrets(tmp_path):
    start = time.time() - 1
    result = submit(
        "--dry-run",
        "--address",
        "http://127.0.0.1:8265",
        "model=tiny",
        "generations=2",
        env={"WANDB_API_KEY": SECRET, "HF_TOKEN": "hf_fake_456"},
        tmp=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr and "hf_fake_456" not in result.stdout
    assert "WANDB_API_KEY=***" in result.stdout and "HF_TOKEN=***" in result.stdout
    assert files_containing(SECRET, ROOT, start) == []
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing, not even a private copy


def test_submit_passes_secrets_in_a_private_file(tmp_path):
    """A stand-in for `ray` records what submit.sh gives it: the key is in a mode-600 copy of
    the runtime env outside the repository, never on the command line, and the copy is gone
    afterwards."""
    record = tmp_path / "record.json"
    fake_ray = tmp_path / "bin" / "ray"
    fake_ray.parent.mkdir()
    fake_ray.write_text(f"""#!{sys.executable}
import json, os, sys
path = sys.argv[sys.argv.index("--runtime-env") + 1]
json.dump({{"argv": sys.argv[1:], "path": path, "mode": os.stat(path).st_mode & 0o777,
           "runtime_env": open(path).read()}}, open({str(record)!r}, "w"))
""")
    fake_ray.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    start = time.time() - 1
    result = submit(
        "--address",
        "http://127.0.0.1:8265",
        "model=tiny",
        env={"WANDB_API_KEY": SECRET, "RAY": str(fake_ray), "TMPDIR": str(scratch)},
        tmp=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(record.read_text())
    assert SECRET not in " ".join(seen["argv"])
    assert seen["argv"][-2:] == ["evora", "model=tiny"] and "--working-dir" in seen["argv"]
    assert seen["mode"] == 0o600
    assert not Path(seen["path"]).resolve().is_relative_to(ROOT)
    env = yaml.safe_load(seen["runtime_env"])
    expected = yaml.safe_load((LAUNCH / "runtime_env.yaml").read_text())
    assert env["env_vars"] == {**expected["env_vars"], "WANDB_API_KEY": SECRET}
    assert env["excludes"] == expected["excludes"]
    assert not Path(seen["path"]).exists() and list(scratch.iterdir()) == []
    record.unlink()
    assert files_containing(SECRET, ROOT, start) == []


# --- Dockerfiles -------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    )
    return [(m.group(1).upper(), m.group(2).strip()) for m in re.finditer(r"^\s*(\w+)\s+(.*)$", text, re.M)]


def makefile_extras() -> tuple[set[str], set[str]]:
    """(CPU, GPU) extras of `make` without the dev tools: the default EXTRAS, and the one
    the Makefile's header gives for GPU machines."""
    text = (ROOT / "Makefile").read_text()
    cpu = re.search(r"^EXTRAS \?= *(\S+)", text, re.M).group(1)
    gpu = re.search(r"^#.*GPU.*EXTRAS=(\S+)", text, re.M).group(1)
    return set(cpu.split(",")) - {"dev"}, set(gpu.split(",")) - {"dev"}


def make_variables(args: str) -> dict[str, str]:
    words = shlex.split(args)
    assert words[:2] == ["make", "setup"], args
    return dict(w.split("=", 1) for w in words[2:] if "=" in w)


@pytest.mark.parametrize("flavour", ["cpu", "gpu"], ids=["Dockerfile.cpu", "Dockerfile.gpu"])  # not "gpu": a marker
def test_dockerfile(flavour):
    path = ROOT / "docker" / f"Dockerfile.{flavour}"
    steps = instructions(path)
    assert f"docker build -f docker/{path.name} -t evora:{flavour} ." in path.read_text().splitlines()[0]
    (base,) = [args for name, args in steps if name == "FROM"]
    image, _, tag = base.partition(":")
    assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"pin the base image: {base}"

    copied = set()
    for name, args in steps:
        if name == "COPY":
            words = [w for w in shlex.split(args) if not w.startswith("--")]
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the build context (repository root)"
                copied.add(source.rstrip("/"))
    # conf: evora/conf links to it; constraints.txt: the versions `make setup` installs within
    assert {"pyproject.toml", "constraints.txt", "Makefile", "README.md", "evora", "conf"} <= copied

    (setup,) = [args for name, args in steps if name == "RUN" and "make setup" in args]
    variables = make_variables(setup[setup.index("make setup") :].split("&&")[0])
    assert set(variables["EXTRAS"].split(",")) == makefile_extras()[flavour == "gpu"]
    default_torch = re.search(r"^TORCH \?= *(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert variables.get("TORCH", default_torch) == default_torch

    users = [args for name, args in steps if name == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["evora"]
    assert any(name == "ENV" and "PATH=/opt/evora/venv/bin:$PATH" in args for name, args in steps)
    assert variables["VENV"] == "/opt/evora/venv"
    if flavour == "cpu":  # vLLM's CPU KV cache must be sized; evora sets it per run as well
        assert any(name == "ENV" and "VLLM_CPU_KVCACHE_SPACE=" in args for name, args in steps)


def test_dockerignore_keeps_local_state_out():
    patterns = {
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "runs"} <= patterns
    assert not patterns & {"evora", "conf", "pyproject.toml", "Makefile", "README.md", "launch"}


# --- launch/local_cluster.sh on this machine ----------------------------------------------


def pids_naming(text: str) -> set[int]:
    table = subprocess.run(["ps", "-axww", "-o", "pid=,args="], capture_output=True, text=True).stdout
    return {int(line.split(None, 1)[0]) for line in table.splitlines() if text in line}


@pytest.mark.slow
def test_local_cluster_starts_two_nodes_and_stops_only_itself():
    # A short temp dir of its own (Ray's socket paths must fit in 107 characters) and free
    # ports: nothing is shared with other Ray instances on this machine.
    temp_dir = tempfile.mkdtemp(prefix="evc", dir="/tmp")
    script = [str(LAUNCH / "local_cluster.sh")]
    where = ["--temp-dir", temp_dir, "--port", str(free_port())]
    env = {**os.environ, "RAY": str(RAY)}
    env.pop("RAY_ADDRESS", None)
    # Bystanders that stop must leave alone: a process of a sibling dir sharing the prefix.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", f"--temp-dir={temp_dir}x/"])
    try:
        started = subprocess.run(
            [*script, "--num-workers", "1", "--client-port", str(free_port()), *where],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        assert "2 nodes" in started.stdout
        status = subprocess.run([*script, "status", *where], capture_output=True, text=True, timeout=120, env=env)
        assert len(re.findall(r"^\s+1 node_", status.stdout, re.M)) == 2, status.stdout + status.stderr
        assert pids_naming(f"={temp_dir}/")

        printed = [line.strip() for line in started.stdout.splitlines()]
        runs = [line for line in printed if COMMAND.match(line)]
        assert runs, started.stdout
        for line in runs:
            assert preflight(evora_argv(line))

        stopped = subprocess.run([*script, "stop", *where], capture_output=True, text=True, timeout=120, env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert not pids_naming(f"={temp_dir}/")
        assert bystander.poll() is None, "stop killed a process of another temp dir"
    finally:
        subprocess.run([*script, "stop", *where], capture_output=True, timeout=120, env=env)
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)
