"""One-line config checks (`<key>=<value>: <rule>`), shared by config validation and by
every strategy's and every task's own `validate`."""

from __future__ import annotations

import json
import math
from typing import Any

from evora.errors import ConfigError


def fail(key: str, value: Any, rule: str) -> ConfigError:
    shown = json.dumps(value) if isinstance(value, str) else value
    return ConfigError(f"{key}={shown}: {rule}")


def require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise fail(key, value, rule)


def choice(key: str, value: Any, allowed: tuple) -> None:
    require(value in allowed, key, value, "allowed: " + ", ".join(map(str, allowed)))


def finite(key: str, value: float) -> None:
    require(math.isfinite(value), key, value, "must be a finite number")
