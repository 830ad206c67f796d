"""Where a model lives: a bundled asset (`evora:tiny`), a local directory or a hub id."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from evora.errors import ConfigError, RunError

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


HUB_TIMEOUT_S = 5.0  # the hub's answer to one metadata request; transformers' own retries take half a minute


def check_hub_model(spec: str, revision: str | None = None, key: str = "model.path") -> None:
    """A hub model about to be read: in the local cache, or the hub answers within seconds;
    otherwise one line naming `key`, the cache folder and HF_HUB_OFFLINE. Offline and not
    cached is bad input (exit 2); a hub out of reach, a runtime failure (exit 1)."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(try_to_load_from_cache(spec, "config.json", revision=revision), str):
        return
    cache = constants.HF_HUB_CACHE
    remedy = (
        f"download it where there is network (hf download {spec}) and point HF_HUB_CACHE at that cache, "
        f"or set {key} to a local model folder"
    )
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f'{key}="{spec}": not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1; {remedy}')
    try:
        HfApi().model_info(spec, revision=revision, timeout=HUB_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError):
        raise ConfigError(f'{key}="{spec}": no such model on the hub, or no access to it') from None
    except Exception as error:  # the hub's client raises its transport's errors (httpx), not OSError
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise RunError(
            f'{key}="{spec}": the Hugging Face hub ({constants.ENDPOINT}) cannot be reached ({reason}) and the '
            f"model is not in the cache ({cache}); {remedy}; on a node without internet set HF_HUB_OFFLINE=1"
        ) from None


@contextmanager
def hub_access(spec: str, key: str = "model.path") -> Iterator[None]:
    """A model or tokenizer that cannot be fetched from the hub: one line naming `key`.
    No such repository or revision is bad input; a hub out of reach is a runtime failure."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
    except OSError as error:
        causes: list[BaseException] = []
        cause: BaseException | None = error
        while cause is not None:
            causes.append(cause)
            cause = cause.__cause__ or cause.__context__
        if any(isinstance(c, (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError)) for c in causes):
            raise ConfigError(f'{key}="{spec}": no such model on the hub, or no access to it') from None
        raise RunError(
            f'{key}="{spec}": cannot reach the Hugging Face hub and the model is not in the local cache; '
            "set model.path to a local model directory, or download it once and set HF_HUB_OFFLINE=1"
        ) from None
