"""The adapters strategy=merge combines: found (a PEFT folder, a run folder's adapters/best, or a
hub id), checked against the run's LoRA, and read onto its layout.

A source i of rank r_i and scale s_i = alpha_i / r_i is kept as its A_i [r_i, in] and
(s_i / s) B_i [out, r_i] for every module of the run's layout (s = lora.alpha / lora.rank; zeros
where the source does not adapt the module), so that s B A over the kept factors is the source's
own delta s_i B_i A_i and any combination is scaled by the run's s alone."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from evora.config.checks import fail, require
from evora.errors import ConfigError, hub_error
from evora.lora.layout import AdapterLayout
from evora.lora.peft_io import CONFIG_FILE, WEIGHTS_FILE, load_adapter_tensors, read_adapter_config
from evora.models import BUNDLED_DIR, BUNDLED_PREFIX
from evora.strategies.protocol import Tensors

if TYPE_CHECKING:
    pass

GRANULARITIES = ("adapter", "layer")
COMBINES = ("concat", "lorahub")
RUN_ADAPTER = Path("adapters") / "best"  # what a run folder contributes


def is_adapter(folder: Path) -> bool:
    return (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def resolve_source(entry: str, key: str) -> Path:
    """The PEFT folder `entry` names: itself, a run folder's adapters/best, a bundled adapter
    (`evora:tiny_adapters/<name>`), or a hub repository's files (downloaded, or from the hub's
    cache when offline)."""
    bundled = entry.startswith(BUNDLED_PREFIX)  # evora:tiny_adapters/<name>: the quickstart's
    path = BUNDLED_DIR / entry[len(BUNDLED_PREFIX) :] if bundled else Path(entry).expanduser()
    for folder in (path, path / RUN_ADAPTER):
        if is_adapter(folder):
            return folder
    if bundled or path.exists() or entry.count("/") != 1 or entry.startswith((".", "/", "~")):
        raise fail(key, entry, f"not a PEFT adapter folder ({CONFIG_FILE} + {WEIGHTS_FILE}) nor a run folder")
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(entry, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE]))
    except Exception as error:  # missing or gated: exit 2; the hub out of reach: exit 1
        raise hub_error(key, entry, "not a local folder, and the hub gave no adapter", error) from None
    require(is_adapter(folder), key, entry, f"the hub repository has no {WEIGHTS_FILE}")
    return folder


def source_rank(folder: Path, key: str, config: dict | None = None) -> int:
    """The adapter's rank, where evora can merge it (its adapter_config.json, read here unless given)."""
    config = read_adapter_config(folder) if config is None else config
    for unsupported in ("use_rslora", "use_dora"):
        require(not config.get(unsupported), key, str(folder), f"{unsupported}=true adapters cannot be merged here")
    require(
        not config.get("rank_pattern") and not config.get("alpha_pattern"), key, str(folder), "has per-module ranks"
    )
    return int(config["r"])


def needed_rank(ranks: Sequence[int], combine: str) -> int:
    """The LoRA rank a combination takes: every source's directions side by side (concat), or
    the widest source's (lorahub)."""
    return sum(ranks) if combine == "concat" else max(ranks)


def check_sources(adapters: Sequence[str], combine: str, rank: int | None) -> None:
    require(len(adapters) >= 2, "strategy.adapters", list(adapters), "must name at least two adapters to merge")
    ranks = [
        source_rank(resolve_source(a, f"strategy.adapters[{i}]"), f"strategy.adapters[{i}]")
        for i, a in enumerate(adapters)
    ]
    need = needed_rank(ranks, combine)
    if rank is not None:
        rule = f"must be at least {need} for strategy.combine={combine} of ranks {ranks}"
        require(rank >= need, "lora.rank", rank, rule)


def load_sources(adapters: Sequence[str], layout: AdapterLayout) -> list[Tensors]:
    """Each source's factors on the run's layout (module docstring)."""
    return [
        load_source(resolve_source(a, f"strategy.adapters[{i}]"), layout, f"strategy.adapters[{i}]")
        for i, a in enumerate(adapters)
    ]


def load_source(folder: Path, layout: AdapterLayout, key: str) -> Tensors:
    import torch  # here: the config's checks above run in the CLI, without torch

    config = read_adapter_config(folder)
    rank = source_rank(folder, key, config)
    ratio = (float(config["lora_alpha"]) / rank) / layout.scale
    loaded = load_adapter_tensors(folder)
    shapes = layout.shapes()
    for name in loaded:
        if name not in shapes:
            raise ConfigError(f'{key}="{folder}": adapts {name}, which lora.target_modules and lora.layers leave out')
    out: Tensors = {}
    for slot in layout.modules:
        a = loaded.get(slot.a_key, torch.zeros(rank, slot.in_features))
        b = loaded.get(slot.b_key, torch.zeros(slot.out_features, rank))
        if tuple(a.shape) != (rank, slot.in_features) or tuple(b.shape) != (slot.out_features, rank):
            found = f"{tuple(a.shape)} and {tuple(b.shape)}"
            raise ConfigError(f'{key}="{folder}": {slot.name} has shapes {found}, not rank {rank} of the model\'s')
        out[slot.a_key], out[slot.b_key] = a.clone(), b * ratio
    return out
