# Softmax in Attention: build the book, test everything.
# Every target sets up .venv from nothing when it is missing or stale.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CHAPTERS := $(wildcard chapters/*.ipynb chapters/*/*.ipynb)
JB_FLAGS := -W -n --keep-going
export PYTHONHASHSEED := 0

.PHONY: all setup book pdf screenshots lint typecheck doctest format test test-a11y test-fast test-portable test-oldest execute lab bench student clean

all: test

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	$(BIN)/python tools/install.py -r requirements.txt
	touch $(STAMP)

## book: build the website into _build/html (a warning is a failure)
book: $(STAMP)
	$(BIN)/jupyter-book build . $(JB_FLAGS)
	@echo "Open _build/html/index.html"

## pdf: the whole book as one PDF, _build/pdf/book.pdf (single-page HTML printed by
# headless Chromium: figures, math and a table of contents, no TeX)
pdf: $(STAMP)
	$(BIN)/jupyter-book build . --builder singlehtml
	$(BIN)/python tools/pdf.py --html _build/singlehtml --out _build/pdf/book.pdf

## lint: ruff's checks and its formatting, on the library, the tests and the benchmarks
# (the chapters get the same settings: ruff format chapters && ruff check chapters)
LINTED := lib tests benchmarks tools experiments chapters conftest.py
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)

## typecheck: mypy on lib/ (both packages; the settings are [tool.mypy] in pyproject.toml)
typecheck: $(STAMP)
	$(BIN)/mypy

## doctest: the docstrings' examples ("Equivalent to" and Examples sections) of lib/,
# run as doctests (no GPU needed: the Triton kernels import on any machine)
doctest: $(STAMP)
	$(BIN)/python -m pytest --doctest-modules lib -p no:nbval -o addopts="" -q \
	    -p no:cacheprovider

## format: apply ruff's formatting and its safe fixes
format: $(STAMP)
	$(BIN)/ruff format $(LINTED)
	$(BIN)/ruff check --fix $(LINTED)

## test: lint, mypy, the doctests, unit tests, strict nbval on every chapter, the book build
# and the browser check. Two pytest workers (the machine's two cores), the website built
# beside them. --dist loadgroup is scheduled by tests/conftest.py: a notebook's cells,
# and each website or course-kit test file, stay on one worker; the unit tests go one
# by one to whichever worker is free. mypy and the doctests of lib/ (collected by the
# root conftest.py when lib is named) run as some of those tests: before pytest, their
# minute on one core kept the other core waiting.
test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not a11y" tests chapters lib

## test-a11y: axe-core's WCAG 2.1 AA rules on every built page, light and dark mode
# (serious or critical findings fail). Minutes of browser time: run before a merge that
# touches the theme, the templates, _static/ or a page's markup.
test-a11y: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests/book/test_site.py -m a11y -p no:nbval -o addopts=""

## screenshots: a full-page screenshot of every page at 1280 and 390 px in
# _build/screenshots/ (after `make book`), the browser test run with SCREENSHOTS=1
screenshots: $(STAMP)
	SCREENSHOTS=1 $(BIN)/python -m pytest -n 2 tests/book/test_site.py -k reads_well \
	    -p no:nbval -o addopts=""

## test-fast: the library's unit tests only
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -p no:nbval -m "not slow" -o addopts=""

## test-portable: strict nbval on every chapter as other machines would run it.
# Each configuration is CAPABILITY:THREADS. ATEN_CPU_CAPABILITY picks torch's vectorized
# kernels, MKL_ENABLE_INSTRUCTIONS and ONEDNN_MAX_CPU_ISA those of its BLAS, and the thread
# count splits sums differently: together they reorder float sums the way another CPU does.
# `native` leaves the instruction sets to the machine. NB=... checks a single chapter.
PORTABLE ?= default:1 avx2:2 native:2
test-portable: $(STAMP)
	@failed=""; for config in $(PORTABLE); do \
	    cap=$${config%%:*}; threads=$${config##*:}; \
	    case $$cap in \
	        default) isa="ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41";; \
	        avx2) isa="ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2";; \
	        native) isa="";; \
	        *) echo "unknown capability $$cap (expected default, avx2 or native)"; exit 2;; \
	    esac; \
	    echo "== nbval, CPU kernels: $$cap, threads: $$threads"; \
	    env $$isa OMP_NUM_THREADS=$$threads MKL_NUM_THREADS=$$threads \
	        $(BIN)/python -m pytest -n 2 --dist loadfile $(if $(NB),$(NB),chapters) -q \
	        || failed="$$failed $$config"; \
	done; \
	if [ -n "$$failed" ]; then echo "nbval failed under:$$failed"; exit 1; fi

## test-oldest: the unit tests against the oldest torch and numpy that pyproject.toml
# allows, with the oldest matplotlib of its [book] extra (a separate venv;
# tests/book/test_workflows.py checks that these pins are the declared lower bounds).
# PyPI's torch wheels for Linux bring CUDA libraries (about 2.5 GB); torch's own pin of Triton is removed, so the kernel tests skip. The
# tests of the website, the workflows and the student tool need the book's tools, not
# the library's lower bounds, and are left to `make test`.
OLDEST   := .venv-oldest
OLDEST_PINS := torch==2.5.0 numpy==1.24.0
# bookkit's tests draw figures: the oldest matplotlib the [book] extra allows
OLDEST_BOOK_PINS := matplotlib==3.7.0
test-oldest:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet $(OLDEST_PINS) $(OLDEST_BOOK_PINS) \
	    entmax==1.3 tqdm ipython pytest hypothesis
	$(OLDEST)/bin/python -m pip uninstall --quiet --yes triton
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e .
	env -u CI $(OLDEST)/bin/python -m pytest tests -p no:nbval -o addopts="" \
	    -m "not slow" --ignore=tests/book/test_book.py --ignore=tests/book/test_site.py \
	    --ignore=tests/book/test_workflows.py --ignore=tests/book/test_student.py \
	    --ignore=tests/book/test_colab_cell.py -p no:cacheprovider

## execute: re-run every chapter in place, refreshing its stored outputs
execute: $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False \
	    $(if $(NB),$(NB),$(CHAPTERS))

## student: student versions of the chapters in _build/student (same layout as chapters/):
# plain Markdown for Jupyter and Colab, solutions and hidden answer cells removed,
# exercise outputs cleared, a first cell that installs this release in Colab (the
# conventions are in tools/student.py). NB=... converts one.
student: $(STAMP)
	$(BIN)/python tools/student.py --out _build/student $(if $(NB),$(NB),$(CHAPTERS))

## experiments: re-run the seed sweeps of chapters 9 and 10 on two cores (minutes each)
# into lib/softmaxbook/data/; tests/bookkit/test_experiments.py and test_sink_sweep.py check them.
.PHONY: experiments
experiments: $(STAMP)
	$(BIN)/python experiments/case_study_sweep.py --workers 2
	$(BIN)/python experiments/sink_sweep.py --workers 2

## gpu-report: compile every Triton kernel ahead of time for sm_80, sm_90 and sm_100
# (no GPU needed: Triton ships ptxas and cuobjdump) into _build/gpu-report.json, and
# refresh the kernels page's copy, lib/bookkit/data/gpu_report.json: registers, spills,
# shared memory, tensor-core MMA and MUFU.EX2 counts. Fails on a new spill (the known
# float32 ones are listed in the tool) or a block over its shared memory. ~5-17 min on 2 cores.
# On a CUDA machine, GPU_REPORT_FLAGS=--time also times the kernels against torch.
.PHONY: gpu-report
gpu-report: $(STAMP)
	$(BIN)/python tools/gpu_report.py --store $(GPU_REPORT_FLAGS)

## lab: JupyterLab on the chapters
lab: $(STAMP)
	$(BIN)/python -m pip install --quiet jupyterlab
	$(BIN)/jupyter lab chapters/

## bench: the benchmarks against torch and the entmax package
bench: $(STAMP)
	@for script in benchmarks/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf _build .pytest_cache .hypothesis .ruff_cache .mypy_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
