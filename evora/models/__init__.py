"""Where a model lives: a bundled asset (`evora:tiny`), a local directory or a hub id."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from evora.errors import ConfigError

BUNDLED_DIR = Path(__file__).resolve().parent
BUNDLED_PREFIX = "evora:"
# org/name or name, as on the Hugging Face hub
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class ModelLocation:
    path: str  # a local directory, or a hub id
    is_local: bool


def bundled_models() -> list[str]:
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def locate_model(spec: str, key: str = "model.path") -> ModelLocation:
    """Resolve a model reference, or raise ConfigError naming `key`."""
    if spec.startswith(BUNDLED_PREFIX):
        name = spec[len(BUNDLED_PREFIX) :]
        folder = BUNDLED_DIR / name
        if not (folder / "config.json").is_file():
            allowed = ", ".join(BUNDLED_PREFIX + n for n in bundled_models())
            raise ConfigError(f'{key}="{spec}": no bundled model of that name; allowed: {allowed}')
        return ModelLocation(str(folder), True)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f'{key}="{spec}": directory has no config.json (not a model directory)')
        return ModelLocation(str(folder.resolve()), True)
    if spec.startswith(("/", ".", "~")) or not _HUB_ID.match(spec):
        raise ConfigError(f'{key}="{spec}": directory not found, and not a hub id like Qwen/Qwen2.5-0.5B-Instruct')
    return ModelLocation(spec, False)
