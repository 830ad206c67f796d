"""transformers' candidate generator without scikit-learn at import (evora/engines/deferred_imports.py):
a new process that loads a tokenizer and a model class imports no sklearn, and the generator's
availability check and roc_curve answer as transformers' own do."""

import subprocess
import sys

PROBE = """
import sys
from evora.engines.deferred_imports import defer_sklearn
defer_sklearn()
from transformers import AutoModelForCausalLM, AutoTokenizer
import transformers.generation.candidate_generator as generator
import transformers.utils
print("sklearn" in sys.modules, "scipy.stats" in sys.modules)
print(generator.is_sklearn_available is transformers.utils.is_sklearn_available, generator.is_sklearn_available())
fpr, tpr, thresholds = generator.roc_curve([0, 1, 1, 0], [0.1, 0.8, 0.6, 0.4])
from sklearn.metrics import roc_curve
print([list(a) for a in (fpr, tpr, thresholds)] == [list(a) for a in roc_curve([0, 1, 1, 0], [0.1, 0.8, 0.6, 0.4])])
"""


def test_a_process_loads_transformers_without_sklearn_and_assisted_generation_still_finds_it():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "False", "True", "True", "True"], done.stdout
