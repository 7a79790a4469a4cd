# The two commands of the README. Both set up .venv first (tools/setup.sh is idempotent).
PY := .venv/bin/python
RANKS ?= 16

.PHONY: setup run test test-site-mpi test-mpich lint

setup:
	@bash tools/setup.sh

run: setup
	bash tools/mpirun.sh -n $(RANKS) $(PY) -m hpcmarl $(ARGS)

# The whole suite, with what it needs beyond .venv (h5dump, a local Slurm, Horovod) set up first,
# on TEST_WORKERS pytest-xdist workers (tests/conftest.py says how it is dealt out; 0: one
# process, as plain `pytest tests` runs it).
TEST_WORKERS ?= 2
test: setup
	@bash tools/setup_tests.sh
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

# The failure suite again under MPICH; an exception in and a kill -9 of the commander and of a
# collector stand for every role there (Open MPI runs all).
MPICH_SUITE := tests/faults tests/mpi/test_transport.py \
	-k "not ((kill_9 or exception_in_any_role) and (ps0 or replay or learner or param_server))"

# Across the hosts of tools/local_cluster.sh with MPICH's Hydra (tools/mpirun.sh --hosts): a send
# and the doorbells.
MPICH_HOSTS := tests/multihost/test_cluster_tools.py -k "send_reaches or doorbell"

# CI's: MPICH set up the way a cluster's MPI is (tools/setup.sh --mpi site, into .venv-site):
# mpi4py compiled by Debian's mpicc.mpich (libmpich-dev, standing in for `module load mpich`)
# and launched by mpiexec.mpich, both named, since Debian's mpicc and mpirun alternatives may
# point at an Open MPI that something else installed. CFLAGS=-O0: the stand-in's mpi4py builds in
# 45 s of CPU instead of 6 min (measured), which CI's clean clone pays each time; a site build
# keeps the compiler's optimisation (the wheel cache is keyed by CFLAGS too).
test-site-mpi:
	@command -v mpicc.mpich >/dev/null || { \
		echo "hpcmarl: installing Debian's libmpich-dev (the site MPI of this test)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmpich-dev \
			>/dev/null; }
	@CFLAGS=-O0 MPICC=mpicc.mpich MPIEXEC=mpiexec.mpich bash tools/setup.sh --mpi site
	.venv-site/bin/python -m pytest -q $(MPICH_SUITE)
	.venv-site/bin/python -m pytest -q $(MPICH_HOSTS)

# The same under PyPI's mpich wheel (.venv-mpich, tools/setup.sh --mpi mpich); not run by CI.
test-mpich:
	@bash tools/setup.sh --mpi mpich
	.venv-mpich/bin/python -m pytest -q $(MPICH_SUITE)

lint: setup
	.venv/bin/ruff check hpcmarl tests tools
	.venv/bin/ruff format --check hpcmarl tests tools
	.venv/bin/mypy hpcmarl
