# The two commands of the README. Both set up .venv first (tools/setup.sh is idempotent).
PY := .venv/bin/python
RANKS ?= 16

.PHONY: setup run test test-mpich lint

setup:
	@bash tools/setup.sh

run: setup
	bash tools/mpirun.sh -n $(RANKS) $(PY) -m hpcmarl $(ARGS)

# The whole suite, with what it needs beyond .venv (h5dump, a local Slurm, Horovod) set up first.
test: setup
	@bash tools/setup_tests.sh
	$(PY) -m pytest -q tests

# The failure suite again under MPICH (a second virtualenv, .venv-mpich); an exception in and
# a kill -9 of the commander and of a collector stand for every role there (Open MPI runs all).
test-mpich:
	@bash tools/setup.sh --mpi mpich
	.venv-mpich/bin/python -m pytest -q tests/faults tests/mpi/test_transport.py \
		-k "not ((kill_9 or exception_in_any_role) and (ps0 or replay or learner or param_server))"

lint: setup
	.venv/bin/ruff check hpcmarl tests tools
	.venv/bin/ruff format --check hpcmarl tests tools
	.venv/bin/mypy hpcmarl
