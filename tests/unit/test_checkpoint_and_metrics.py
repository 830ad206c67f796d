import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from evora.tracking.checkpoint import atomic_save, load
from evora.tracking.metrics import JsonlSink, read_metrics
from evora.tracking.run_dir import redact


def test_atomic_save_roundtrip_of_plain_state(tmp_path):
    state = {"theta": {"a": torch.randn(3, 4)}, "step": 3, "best": None, "x": [1.5, "s"]}
    atomic_save(state, tmp_path / "c" / "latest.pt")
    again = load(tmp_path / "c" / "latest.pt")
    assert torch.equal(again["theta"]["a"], state["theta"]["a"]) and again["step"] == 3
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["latest.pt"]


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "latest.pt"
    atomic_save({"step": 1}, path)
    # A child that dies (SIGKILL-equivalent os._exit) in the middle of torch.save.
    code = f"""
import os, torch
import evora.tracking.checkpoint as c
real = torch.save
def dying_save(obj, handle):
    handle.write(b"partial bytes of a torn checkpoint")
    handle.flush()
    os._exit(9)
torch.save = dying_save
c.atomic_save({{"step": 2}}, {str(path)!r})
"""
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    assert load(path) == {"step": 1}


WRITER = """
import sys, torch
from evora.tracking.checkpoint import atomic_save
for version in range(1000):
    print(f"writing {version}", flush=True)
    atomic_save({"version": version, "theta": torch.full((4_000_000,), float(version))}, sys.argv[1])
"""


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_checkpoints_survive_sigkill_during_a_write(tmp_path, kill_at):
    """A real SIGKILL while a 16 MB checkpoint is being written: the file on disk is the
    previous version or the new one, whole."""
    path = tmp_path / "latest.pt"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    for line in writer.stdout:  # the kill lands right after the writer announces a write
        if line.strip() == f"writing {kill_at}":
            writer.send_signal(signal.SIGKILL)
            break
    writer.wait()
    assert writer.returncode == -signal.SIGKILL
    saved = load(path)
    assert saved["version"] in (kill_at - 1, kill_at)
    assert torch.equal(saved["theta"], torch.full((4_000_000,), float(saved["version"])))


def test_jsonl_sink_truncates_uncovered_generations_on_resume(tmp_path):
    sink = JsonlSink(tmp_path)
    for generation in range(5):
        sink.log({"generation": generation, "reward_mean": generation / 10, "x": float("nan")})
    sink.close()
    assert read_metrics(tmp_path)[0]["x"] is None  # NaN is not JSON
    JsonlSink(tmp_path, completed_generations=2).close()
    assert [r["generation"] for r in read_metrics(tmp_path)] == [0, 1, 2]


def test_redaction_hides_keys_and_tokens():
    cfg = {"tracking": {"wandb_api_key": "sk-123", "name": "w"}, "hf_token": "hf_x", "nested": [{"secret": "s"}]}
    out = json.dumps(redact(cfg))
    assert "sk-123" not in out and "hf_x" not in out and '"s"' not in out and '"w"' in out


# --- checkpoint format and versions ------------------------------------------------------


def _es_state():
    from evora.strategies.es import ESState

    return ESState(theta={"a": torch.ones(2)}, step=4, noise_scales={"a": 2.0})


def test_a_checkpoint_round_trips_the_typed_state(tmp_path):
    from evora.strategies.es import ESState
    from evora.strategies.protocol import state_fields
    from evora.tracking.checkpoint import load_run_state, run_state

    state = _es_state()
    atomic_save(run_state("es", state, state_fields(state), {"next_generation": 4}), tmp_path / "latest.pt")
    saved = load_run_state(tmp_path / "latest.pt", "es", ESState)
    again = ESState(**saved["state"])
    assert again.step == 4 and torch.equal(again.theta["a"], state.theta["a"]) and again.noise_scales == {"a": 2.0}
    assert saved["loop"] == {"next_generation": 4}


@pytest.mark.parametrize(
    "change,expected",
    [
        ({"version": 2}, "checkpoint format 2 of strategy es"),
        ({"strategy": "ga"}, "of strategy ga"),
        ({"state_version": 99}, "(ESState v99)"),
        ({"format": None}, "not an evora checkpoint"),
    ],
)
def test_an_old_or_foreign_checkpoint_fails_in_one_line(tmp_path, change, expected):
    from evora.errors import ConfigError
    from evora.strategies.es import ESState
    from evora.strategies.protocol import state_fields
    from evora.tracking.checkpoint import load_run_state, run_state

    state = _es_state()
    saved = {**run_state("es", state, state_fields(state), {}), **change}
    atomic_save(saved, tmp_path / "latest.pt")
    with pytest.raises(ConfigError) as error:
        load_run_state(tmp_path / "latest.pt", "es", ESState)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_is_not_a_checkpoint_fails_in_one_line(tmp_path):
    from evora.errors import ConfigError
    from evora.strategies.es import ESState
    from evora.tracking.checkpoint import load_run_state

    (tmp_path / "latest.pt").write_text("not a checkpoint")
    with pytest.raises(ConfigError, match="not an evora checkpoint"):
        load_run_state(tmp_path / "latest.pt", "es", ESState)


def test_a_failed_checkpoint_write_keeps_the_previous_one_and_names_the_folder(tmp_path):
    from evora.errors import RunError

    path = tmp_path / "checkpoints" / "latest.pt"
    atomic_save({"generation": 1}, path)
    # The temporary file is a link to /dev/full: every write fails with ENOSPC, as on a full disk.
    (path.parent / f".latest.pt.tmp-{os.getpid()}").symlink_to("/dev/full")
    with pytest.raises(RunError) as error:
        atomic_save({"generation": 2, "weights": torch.zeros(1 << 16)}, path)
    assert str(error.value) == (
        f"cannot write latest.pt in {path.parent} (No space left on device); the previous one is kept"
    )
    assert load(path) == {"generation": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["latest.pt"]
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    with pytest.raises(RunError, match=f"cannot write latest.pt in {blocked}"):
        atomic_save({"generation": 1}, blocked / "latest.pt")


def test_saved_generation_reads_the_latest_checkpoint(tmp_path):
    from evora.tracking.checkpoint import latest_path, saved_generation

    assert saved_generation(tmp_path) is None
    atomic_save({"loop": {"next_generation": 7}}, latest_path(tmp_path))
    assert saved_generation(tmp_path) == 7
