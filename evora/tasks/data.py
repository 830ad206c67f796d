"""Task data: records from local files (JSONL, a JSON array, parquet) or from the hub.

Every record comes with where it was read (`file:line`, or `file: row N`), so a bad
record is reported at its place. Hub data goes through `datasets` (lazily imported).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from evora.errors import DataError, hub_error

Located = tuple[dict[str, Any], str]  # (record, where)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _json_array(text: str, path: str) -> list[Located]:
    decoder = json.JSONDecoder()
    records: list[Located] = []
    at = text.index("[") + 1
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text):
            raise DataError(f"{path}:{_line_of(text, at)}: invalid JSON: the array is not closed")
        if text[at] == "]":
            return records
        try:
            record, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: invalid JSON: {error.msg}") from None
        records.append((record, f"{path}:{_line_of(text, at)}"))
        at = end


def _jsonl(text: str, path: str) -> list[Located]:
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append((json.loads(line), f"{path}:{lineno}"))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{lineno}: invalid JSON: {error.msg}") from None
    return records


def read_records(path: str) -> list[Located]:
    """Every record of a .jsonl / .json / .parquet file, each an object (dict)."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"{path}: file not found")
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(file).to_pylist()
        located = [(row, f"{path}: row {i + 1}") for i, row in enumerate(rows)]
    else:
        text = file.read_text(encoding="utf-8")
        located = _json_array(text, path) if text.lstrip().startswith("[") else _jsonl(text, path)
    for record, where in located:
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if not located:  # said here, naming the file, rather than later as splits with no examples
        raise DataError(f"{path}: {'the file is empty' if file.stat().st_size == 0 else 'the file has no records'}")
    return located


def require(record: dict[str, Any], where: str, fields: Iterable[str]) -> None:
    for name in fields:
        if name not in record:
            raise DataError(f"{where}: missing field '{name}'")


def hub_records(dataset: str, config: str | None, splits: Iterable[str]) -> dict[str, list[Located]]:
    """Records of a hub dataset's splits (downloaded on first use, then cached by `datasets`)."""
    try:
        from datasets import load_dataset

        loaded = {split: load_dataset(dataset, config, split=split) for split in splits}
    except Exception as error:  # unknown dataset or split: exit 2; the hub out of reach: exit 1
        why = "cannot load it from the hub; set task.data_path to a local JSONL or parquet file instead"
        raise hub_error("task.dataset", dataset, why, error) from None
    return {
        split: [(dict(row), f"{dataset}[{split}] row {i + 1}") for i, row in enumerate(rows)]
        for split, rows in loaded.items()
    }
