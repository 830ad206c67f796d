"""The tiny model's bundled adapters (evora/models/tiny_adapters), the sources that
`+experiment=quickstart/merge` combines: two made by evora's own ES quickstart (its mean
adapter after 30 generations, and after 2), and one of small random noise. All are rank 1 on the
last layer's down_proj, the quickstart's layout.

    python -m evora.models.build_tiny_adapters      # CPU, about a minute; rewrites the folders
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from evora.lora.init import random_adapter
from evora.lora.layout import build_layout
from evora.lora.modules import adaptable_modules
from evora.lora.peft_io import CONFIG_FILE, WEIGHTS_FILE, read_adapter_config, save_adapter
from evora.models import BUNDLED_DIR

OUT = BUNDLED_DIR / "tiny_adapters"
QUICKSTART = ("+experiment=quickstart/es", "engine=hf", "tracking.progress=false")
RUNS = {"evolved": ("seed=1",), "early": ("seed=2", "generations=2")}


def evolved(name: str, overrides: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "evora.cli", *QUICKSTART, *overrides, f"tracking.out_dir={out}"]
        subprocess.run(command, check=True, cwd=out)
        [run] = Path(out).iterdir()
        shutil.rmtree(OUT / name, ignore_errors=True)
        (OUT / name).mkdir(parents=True)
        shutil.copy(run / "adapters" / "mean" / WEIGHTS_FILE, OUT / name)
        config = read_adapter_config(run / "adapters" / "mean")
        config["base_model_name_or_path"] = "evora:tiny"  # not the folder it was made in
        (OUT / name / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")


def noise() -> None:
    tiny = str(BUNDLED_DIR / "tiny")
    modules = adaptable_modules(tiny)
    layout = build_layout(modules, rank=1, alpha=1.0, target_modules=["down_proj"], layers=[1], base_model="evora:tiny")
    shutil.rmtree(OUT / "noise", ignore_errors=True)
    save_adapter(OUT / "noise", random_adapter(layout, 3, None, 0.05), layout)


if __name__ == "__main__":
    for name, overrides in RUNS.items():
        evolved(name, overrides)
    noise()
