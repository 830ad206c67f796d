"""A generation's payload as an engine worker takes it in: by reference (`SharedPayload`, read
once a generation), and, for a strategy that draws its noise on the workers' GPU
(hardware.noise_device), with its tensors moved there once (`PayloadReader`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evora.strategies.protocol import DeviceNoiseStrategy


@dataclass(frozen=True)
class SharedPayload:
    """A generation's payload by reference. Ray resolves an ObjectRef argument on every call,
    deserialising it again for each unit (the ecology's holds every organelle's adapter: 0.9 s
    a call at 819 organelles, bench/scale.py); wrapped, the worker reads it once."""

    ref: Any  # ray.ObjectRef


class PayloadReader:
    """What a worker draws from: the payload read once when shared (the previous generation's
    dropped, so that its object can go), its tensors on `noise_device` when that is not the CPU
    (RunPlan.noise_device is the CPU for any strategy but a DeviceNoiseStrategy)."""

    def __init__(self, strategy: DeviceNoiseStrategy | None, noise_device: str):
        self.strategy, self.noise_device = strategy, noise_device
        self._last: tuple[Any, Any] = (None, None)  # (ref, payload): the last shared payload read

    def __call__(self, payload: Any) -> Any:
        if not isinstance(payload, SharedPayload):
            return self._to_noise_device(payload)
        if self._last[0] != payload.ref:
            import ray

            self._last = (payload.ref, self._to_noise_device(ray.get(payload.ref)))
        return self._last[1]

    def _to_noise_device(self, payload: Any) -> Any:
        if self.noise_device == "cpu":
            return payload
        assert self.strategy is not None, "RunPlan.noise_device is cpu without a device_noise strategy"
        return self.strategy.payload_to(payload, self.noise_device)
