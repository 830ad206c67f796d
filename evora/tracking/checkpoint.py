"""Atomic checkpoints: write a temporary file, fsync it, rename it over the old one,
fsync the folder. A crash at any moment leaves the previous checkpoint or the new one,
never a torn file."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from evora.errors import ConfigError, RunError

LATEST = "latest.pt"


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """A write that fails (disk full, read-only folder) leaves the previous file as it was and
    stops the run with one line naming the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as error:  # torch.save reports a failed write as a RuntimeError
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise RunError(f"cannot write {path.name} in {path.parent} ({reason}); the previous one is kept") from None
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load(path: str | os.PathLike) -> Any:
    # Checkpoints hold plain data only (dicts, lists, numbers, strings, tensors).
    return torch.load(path, map_location="cpu", weights_only=True)


def latest_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints" / LATEST


FORMAT = "evora-checkpoint"
VERSION = 3  # 3: typed strategy state (state_fields of the strategy's state dataclass) + loop state


class VersionedState(Protocol):
    """A strategy's state dataclass: its layout version is checked on resume."""

    STATE_VERSION: ClassVar[int]


def run_state(
    strategy: str,
    state: Any,
    state_fields: dict[str, Any],
    loop: dict[str, Any],
    devices: dict[str, str] | None = None,
) -> dict[str, Any]:
    """What a checkpoint holds: format and versions (checked on load), the strategy's state, the
    loop's, and the device classes its noise was drawn on (`noise_classes`; read on resume)."""
    saved = {
        "format": FORMAT,
        "version": VERSION,
        "strategy": strategy,
        "state_type": type(state).__name__,
        "state_version": type(state).STATE_VERSION,
        "state": state_fields,
        "loop": loop,
    }
    if devices is not None:
        saved["devices"] = devices
    return saved


def noise_classes(lora: str, full_weights: str, gpu: str) -> dict[str, str]:
    """The device class each kind of noise is drawn on: the CPU, or the workers' GPU model
    (`gpu`, e.g. "NVIDIA H200"), given where the run plan draws it (cpu | cuda)."""
    return {"lora": gpu if lora == "cuda" else "cpu", "full_weights": gpu if full_weights == "cuda" else "cpu"}


def device_change(saved: dict[str, str] | None, now: dict[str, str]) -> str | None:
    """One line when a resumed run draws its noise on another device class than the checkpoint's
    (determinism is promised per class: its numbers from here on differ from an unbroken run's);
    None when they match, or the checkpoint does not say (written before evora recorded it)."""
    if not saved:
        return None
    changed = [
        f"{kind.replace('_', '-')} noise on {saved[kind]}, now on {now[kind]}"
        for kind in now
        if saved.get(kind, now[kind]) != now[kind]
    ]
    if not changed:
        return None
    return (
        f"warning: resumed on another device class ({'; '.join(changed)}): its numbers from here on differ "
        "from an unbroken run's (hardware.noise_device / master_weights=host draw on the CPU's streams)"
    )


def load_run_state(path: Path, strategy: str, state_type: type[VersionedState]) -> dict[str, Any]:
    """A checkpoint written by this evora for this strategy; one-line ConfigError otherwise."""
    try:
        saved = load(path)
    except Exception as error:  # torch raises many types for files that are not its own
        raise ConfigError(f"{path}: not an evora checkpoint ({str(error).splitlines()[0][:120]})") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise ConfigError(f"{path}: not an evora checkpoint (no format marker)")
    found = (saved.get("version"), saved.get("strategy"), saved.get("state_type"), saved.get("state_version"))
    wanted = (VERSION, strategy, state_type.__name__, state_type.STATE_VERSION)
    if found != wanted:
        raise ConfigError(
            f"{path}: checkpoint format {found[0]} of strategy {found[1]} ({found[2]} v{found[3]}); "
            f"this evora reads format {wanted[0]} of {wanted[1]} ({wanted[2]} v{wanted[3]}): "
            "start a new run"
        )
    return saved


def saved_generation(run_dir: str | os.PathLike) -> int | None:
    """The generation the run's latest checkpoint was saved after; None without one."""
    path = latest_path(run_dir)
    if not path.is_file():
        return None
    try:
        return int(load(path)["loop"]["next_generation"])
    except Exception:  # not an evora run checkpoint (a job runner may keep its own): no generation to name
        return None
