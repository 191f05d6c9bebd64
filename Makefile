# `make demo` and `make test` each set up .venv (torch pinned by constraints.txt) and run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test golden bench bench-large clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m golden.demo

test: $(STAMP)
	$(PY) -m pytest -n auto --dist loadgroup -q

golden: $(STAMP)
	$(PY) -m golden.regenerate

bench: $(STAMP)
	$(PY) bench/convert_speed.py
	$(PY) bench/run_speed.py
	$(PY) bench/compile_cache.py

bench-large: $(STAMP)
	$(PY) bench/multi_gb_export.py

clean:
	rm -rf $(VENV) .pytest_cache
