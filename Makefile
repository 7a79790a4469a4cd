# The two commands of the README. Both set up .venv first (tools/setup.sh is idempotent).
PY := .venv/bin/python
RANKS ?= 16

.PHONY: setup run test lint

setup:
	@bash tools/setup.sh

run: setup
	bash tools/mpirun.sh -n $(RANKS) $(PY) -m hpcmarl $(ARGS)

test: setup
	$(PY) -m pytest -q tests

lint: setup
	.venv/bin/ruff check hpcmarl tests tools
	.venv/bin/ruff format --check hpcmarl tests tools
	.venv/bin/mypy hpcmarl
