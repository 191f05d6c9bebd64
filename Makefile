# `make demo` and `make test` each set up .venv (torch pinned by constraints.txt) and run.
# `make test` checks a fixed sample of the OpInfo sweep (tests/tools/test_opinfo_sweep.py) and prints the slowest
# tests and the time per test directory; `make test-full` checks every OpInfo entry (most of an hour on 2 cores);
# `make coverage` re-sweeps everything and regenerates docs/coverage.md and docs/coverage.json;
# `make models` sweeps the transformers architectures of tools/model_table.py into docs/models.md and docs/models.json.
# `make check-imports` runs mypy's import resolution over the package (.ci/check_imports.py): every torch_stablehlo.*
# import resolves statically and the public names are not Any (under a minute on 2 cores; seconds when cached).
# `make check-commands` runs every command README.md and this Makefile show, at small sizes
# (tests/test_documented_commands.py; `make test` runs a fixed share of the quick ones, .ci/run the others too).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-full check-imports check-commands coverage models golden bench bench-large clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m torch_stablehlo.golden.demo
	$(PY) -m torch_stablehlo.serving.served_demo

test: $(STAMP)
	$(PY) -m pytest -n auto -q --durations=25

test-full: $(STAMP)
	$(PY) -m pytest -n auto -q --durations=25 --full-sweep

check-imports: $(STAMP)
	$(PY) .ci/check_imports.py

check-commands: $(STAMP)
	$(PY) -m pytest -n auto -q tests/test_documented_commands.py --documented-commands all

coverage: $(STAMP)
	$(PY) -m torch_stablehlo coverage

models: $(STAMP)
	$(PY) -m torch_stablehlo.tools.model_sweep

golden: $(STAMP)
	$(PY) -m torch_stablehlo.golden.regenerate

bench: $(STAMP)
	$(PY) bench/convert_speed.py
	$(PY) bench/run_speed.py
	$(PY) bench/warm_start.py

bench-large: $(STAMP)
	$(PY) bench/multi_gb_export.py

clean:
	rm -rf $(VENV) .pytest_cache
