"""DESIGN §5: strategies/, lora/ and tasks/rewards/ import no Ray, vLLM or W&B; engines
are imported lazily (vLLM only when the vllm engine is created)."""

import subprocess
import sys

PURE = ["evora.strategies.es", "evora.strategies.shaping", "evora.lora.layout", "evora.lora.noise",
        "evora.lora.peft_io", "evora.lora.init", "evora.lora.base_weights", "evora.tasks.rewards.countdown",
        "evora.tasks.rewards.safe_eval", "evora.tasks.rewards.exact", "evora.tasks", "evora.config.compose",
        "evora.engines"]


def test_pure_packages_import_no_ray_vllm_or_wandb():
    code = f"""
import sys
for m in {PURE!r}:
    __import__(m)
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'wandb'))
print(bad)
assert not bad, bad
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
