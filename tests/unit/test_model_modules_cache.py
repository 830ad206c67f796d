"""A local model's modules are read once and cached on disk by its config.json: a later plan of
the same model reads them without importing transformers (5 s of every run's start), and a
changed config is read again."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from conftest import family_path
from evora.lora.modules import cache_root, config_facts, model_modules

READ_IN_A_FRESH_PROCESS = """
import pickle, sys
from evora.lora.modules import model_modules
modules = model_modules(sys.argv[1])
sys.stdout.buffer.write(pickle.dumps(("transformers" in sys.modules, modules)))
"""


def read_elsewhere(path: str, cache_home) -> tuple[bool, object]:
    import pickle

    env = {"XDG_CACHE_HOME": str(cache_home), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", READ_IN_A_FRESH_PROCESS, path], capture_output=True, env=env)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return pickle.loads(done.stdout)


def test_a_cached_model_is_read_without_transformers_and_a_changed_config_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = tmp_path / "model"
    shutil.copytree(family_path("qwen2"), model)
    imported, first = read_elsewhere(str(model), tmp_path / "cache")
    assert imported and len(list(cache_root().glob("*.pkl"))) == 1  # built with transformers, then cached
    imported, again = read_elsewhere(str(model), tmp_path / "cache")
    assert not imported and again == first

    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"], config["layer_types"] = 1, config["layer_types"][:1]
    (model / "config.json").write_text(json.dumps(config))
    imported, changed = read_elsewhere(str(model), tmp_path / "cache")
    assert imported and changed.facts.layers == 1 and len(changed.adaptable) < len(first.adaptable)
    assert len(list(cache_root().glob("*.pkl"))) == 2
    model_modules.cache_clear()
    assert model_modules(str(model)) == changed  # and this process reads the cached one alike
    model_modules.cache_clear()


def test_config_facts_are_the_kv_cache_of_grouped_query_attention():
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(family_path("qwen2"))
    facts = config_facts(config)
    head_dim = config.hidden_size // config.num_attention_heads
    assert config.num_key_value_heads < config.num_attention_heads  # grouped: fewer KV heads than heads
    assert facts.kv_values_per_token == 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim
    assert facts.layers == config.num_hidden_layers


def test_the_cache_keeps_its_newest_entries_only(tmp_path):
    import os

    from evora.lora.modules import _prune

    for age in range(6):
        entry = tmp_path / f"{age}.pkl"
        entry.write_bytes(b"x")
        os.utime(entry, (1_000_000 - age, 1_000_000 - age))  # 0.pkl the newest
    (tmp_path / "other.txt").write_text("not an entry")
    _prune(tmp_path, keep=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.pkl", "1.pkl", "2.pkl", "3.pkl", "other.txt"]
