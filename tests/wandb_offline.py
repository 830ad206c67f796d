"""W&B's own offline files, read back: the records of a run's `run-<id>.wandb` (W&B's transaction log:
a header, then 32 KiB blocks of records as LevelDB's log writes them, each a `wandb_internal_pb2.Record`).
wandb 0.31 ships no reader of its own in Python (its core, in Go, writes the file)."""

from __future__ import annotations

import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK, HEADER = 32768, 7  # a block; a record's header: crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    found, pieces, position = [], b"", HEADER
    while position + HEADER <= len(data):
        room = BLOCK - position % BLOCK
        if room < HEADER:  # a block's tail too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + HEADER])
        chunk = data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind == 0:  # zeros to the block's end
            position += room - HEADER - length
            continue
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            found.append(record)
    return found


def history_keys(path: Path) -> list[set[str]]:
    """The keys of each logged step."""
    return [
        {item.key or "/".join(item.nested_key) for item in r.history.item}
        for r in records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def artifact_names(path: Path, kind: str) -> set[str]:
    """The names of the run's artifacts of a type (a table logged to a run is an artifact too)."""
    found = (r.artifact for r in records(path) if r.WhichOneof("record_type") == "artifact")
    return {artifact.name for artifact in found if artifact.type == kind}
