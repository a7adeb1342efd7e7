# Softmax in Attention: build the book, test everything.
# Every target sets up .venv from nothing when it is missing or stale.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CHAPTERS := $(wildcard chapters/*.ipynb)
JB_FLAGS := -W -n --keep-going
export PYTHONHASHSEED := 0

.PHONY: all setup book test test-fast execute lab bench clean

all: test

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

## book: build the website into _build/html (a warning is a failure)
book: $(STAMP)
	$(BIN)/jupyter-book build . $(JB_FLAGS)
	@echo "Open _build/html/index.html"

## test: unit tests, strict nbval on every chapter, the book build and the browser check
test: $(STAMP)
	$(BIN)/python -m pytest

## test-fast: the library's unit tests only
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -p no:nbval -m "not slow" -o addopts=""

## execute: re-run every chapter in place, refreshing its stored outputs
execute: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False \
	    $(if $(NB),$(NB),$(CHAPTERS))

## lab: JupyterLab on the chapters
lab: $(STAMP)
	$(BIN)/python -m pip install --quiet jupyterlab
	$(BIN)/jupyter lab chapters/

## bench: the benchmarks against torch and the entmax package
bench: $(STAMP)
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf _build .pytest_cache .hypothesis
	find . -name __pycache__ -prune -exec rm -rf {} +
