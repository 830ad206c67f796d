"""Imports deferred where evora never uses what they bring. transformers' candidate generator
without scikit-learn (evora/engines/deferred_imports.py): a new process that loads a tokenizer and
a model class imports no sklearn, and the generator's availability check and roc_curve answer as
transformers' own do. trl without its vLLM stack (evora/training/grpo_trl.py)."""

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


TRL_PROBE = """
import sys
from evora.training.grpo_trl import from_trl
trainer, config = from_trl("GRPOTrainer"), from_trl("GRPOConfig")
from trl.import_utils import is_vllm_available
print("vllm" in sys.modules, trainer.__name__, config.__name__, is_vllm_available())
"""


def test_trl_imports_its_trainer_without_vllm_and_gives_back_its_check():
    """evora/training/grpo_trl.py: trl's vLLM stack stays unimported in a GRPO driver; trl's own
    question answers truly again afterwards (vLLM is installed here)."""
    done = subprocess.run([sys.executable, "-c", TRL_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].split() == ["False", "GRPOTrainer", "GRPOConfig", "True"], done.stdout
