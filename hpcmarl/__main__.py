"""`python -m hpcmarl [train] [JOB.yaml] [key=value ...]` and `python -m hpcmarl --explain`.

With no job file the built-in default job runs (DQN on CartPole-v1). Under `mpirun` every rank
runs this same command; without it one process hosts every role.
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m hpcmarl [train] [JOB.yaml] [key=value ...]
       python -m hpcmarl --explain        every job key with its type, default and meaning

examples:
  mpirun -n 16 python -m hpcmarl
  python -m hpcmarl jobs/cartpole_dqn.yaml learner.lr=5e-4 topology.collectors=4"""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args and args[0] == "--explain":
        from .config.loader import explain

        print(explain())
        return 0
    if args and args[0] == "train":
        args = args[1:]
    job_path = args[0] if args and "=" not in args[0] else None
    overrides = args[1:] if job_path is not None else args
    from .launch.run import run_job

    return run_job(job_path, overrides)


if __name__ == "__main__":
    sys.exit(main())
