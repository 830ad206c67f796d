"""Compute accounting: what a run spent, in tokens, FLOPs and seconds.

FLOPs are estimated the usual way (Kaplan et al. 2020), with P the base model's parameters:
  a forward pass costs 2 x P x tokens (prompt tokens prefilled, tokens generated, and
  prompt + reference tokens scored for perplexity);
  training costs 6 x P x tokens trained (forward and backward).
LoRA's own parameters are left out (a fraction of a percent of P at the ranks used).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from evora.strategies.protocol import Spend


@dataclass
class ComputeLedger:
    """The run's totals: search (generations, training) apart from evaluation."""

    parameters: int
    search: Spend = field(default_factory=Spend)
    evaluation: Spend = field(default_factory=Spend)
    seconds: dict[str, float] = field(default_factory=lambda: {"setup": 0.0, "search": 0.0, "evaluation": 0.0})

    def search_flops(self) -> float:
        return self.search.flops(self.parameters)["flops"]

    def search_usage(self, extra: Spend | None = None, seconds: float = 0.0) -> dict[str, float]:
        """The search so far (plus `extra` and `seconds` not yet booked) by each budget measure."""
        spend = Spend(**asdict(self.search))
        if extra is not None:
            spend.add(extra)
        return {
            "flops": spend.flops(self.parameters)["flops"],
            "tokens": float(spend.tokens()),
            "seconds": self.seconds.get("search", 0.0) + seconds,
        }

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def summary(self, total_seconds: float) -> dict[str, object]:
        return {
            "parameters": self.parameters,
            "search": self.search.summary(self.parameters),
            "evaluation": self.evaluation.summary(self.parameters),
            "seconds": {**self.seconds, "total": total_seconds},
        }

    def state(self) -> dict[str, object]:
        """Plain data for checkpoints."""
        return {
            "parameters": self.parameters,
            "search": asdict(self.search),
            "evaluation": asdict(self.evaluation),
            "seconds": dict(self.seconds),
        }

    @classmethod
    def from_state(cls, data: dict) -> "ComputeLedger":
        return cls(int(data["parameters"]), Spend(**data["search"]), Spend(**data["evaluation"]), dict(data["seconds"]))


def usage_of_summary(compute: dict) -> dict[str, float]:
    """A finished run's search usage by each budget measure, from its summary's `compute`."""
    search = compute["search"]
    tokens = sum(search[f.name] for f in fields(Spend))
    return {"flops": float(search["flops"]), "tokens": float(tokens), "seconds": float(compute["seconds"]["search"])}
