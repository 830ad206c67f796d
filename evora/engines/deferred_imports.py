"""transformers imports scikit-learn, and SciPy's stats with it, when `transformers.generation` is
first imported (any AutoTokenizer or model): about 2 s of CPU per process, for one function of
assisted generation (`roc_curve`, to tune an assistant model's confidence threshold) that evora
never calls. Every engine worker paid it at its start. `defer_sklearn` imports transformers'
candidate generator with scikit-learn hidden, then gives it back its availability check and a
`roc_curve` that imports scikit-learn at its first call: the same behaviour, paid only by a
process that uses it. Written for transformers 5.x (`generation/candidate_generator.py`); with
another layout the module imports as it would have, and at worst sklearn is imported early."""

from __future__ import annotations

import sys
from typing import Any

CANDIDATE_GENERATOR = "transformers.generation.candidate_generator"


def roc_curve(*args: Any, **kwargs: Any) -> Any:
    from sklearn.metrics import roc_curve as sklearn_roc_curve

    return sklearn_roc_curve(*args, **kwargs)


def defer_sklearn() -> None:
    """Import transformers' candidate generator without scikit-learn (once per process)."""
    if CANDIDATE_GENERATOR in sys.modules:
        return
    import transformers.utils as transformers_utils

    available = transformers_utils.is_sklearn_available
    transformers_utils.is_sklearn_available = lambda: False  # what the module reads at its import
    try:
        import transformers.generation.candidate_generator as candidate_generator
    finally:
        transformers_utils.is_sklearn_available = available
    if getattr(candidate_generator, "is_sklearn_available", None) is not available:
        candidate_generator.is_sklearn_available = available  # its calls at run time ask the real question
    if not hasattr(candidate_generator, "roc_curve"):
        candidate_generator.roc_curve = roc_curve
