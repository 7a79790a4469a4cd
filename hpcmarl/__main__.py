"""`python -m hpcmarl [train] [JOB.yaml] [key=value ...]` and `python -m hpcmarl --explain`.

With no job file the built-in default job runs (DQN on CartPole-v1). Under `mpirun` every rank
runs this same command; without it one process hosts every role.
"""

from __future__ import annotations

import os
import sys

USAGE = """usage: python -m hpcmarl [train] [JOB.yaml] [key=value ...]
       python -m hpcmarl resume RUN_DIR [key=value ...]   continue from the newest checkpoint
       python -m hpcmarl scale RUN_DIR collectors=-N|+N   retire (or put back) collectors of a
                                                          running job
       python -m hpcmarl analyze RUN_DIR_OR_FILE... [--out DIR] [--json]
       python -m hpcmarl export FILE --format minari|d4rl [--agent ID | --team] [--out PATH]
       python -m hpcmarl evaluate RUN_DIR [--episodes N] [--checkpoint ID] [--json]
       python -m hpcmarl export-policy RUN_DIR --format torchscript|onnx|state_dict --out PATH
                         [--policy ID] [--checkpoint ID]   a trained policy, for plain torch
       python -m hpcmarl --explain [KEY]                  every job key (or KEY, or a section)
                                                          with its type, default and meaning

examples:
  mpirun -n 16 python -m hpcmarl
  python -m hpcmarl jobs/cartpole_dqn.yaml learner.lr=5e-4 topology.collectors=4"""


def main(argv: list[str] | None = None) -> int:
    # First of all: a Slurm warning (USR1) during the slow start-up must become a flag the
    # commander acts on, not the default action that kills the process.
    from .launch import signals

    signals.install()
    from .launch.output import keep_running_when_streams_close

    keep_running_when_streams_close()
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if args and args[0] == "--explain":
        return explain_keys(args[1:])
    if args and args[0] in ("analyze", "export"):
        from .analysis import cli

        return int(getattr(cli, f"{args[0]}_main")(args[1:]))
    if args and args[0] == "evaluate":
        from .analysis.evaluate import evaluate_main

        return evaluate_main(args[1:])
    if args and args[0] == "export-policy":
        from .policy_export import export_policy_main

        return export_policy_main(args[1:])
    if args and args[0] == "resume":
        return resume(args[1:])
    if args and args[0] == "scale":
        from .launch.scaling import scale_main

        return scale_main(args[1:])
    from .config.loader import command_job
    from .launch.run import run_job

    return run_job(*command_job(args))


def explain_keys(args: list[str]) -> int:
    """`--explain [KEY]`: every job key, or one key (a section: its keys), with its meaning."""
    from .config.loader import explain
    from .errors import UserError

    try:
        print(explain(args[0] if args else None), end="")
    except UserError as err:
        print(f"hpcmarl: error: {err.message()}", file=sys.stderr)
        return UserError.exit_code
    return 0


def resume(args: list[str]) -> int:
    """`resume RUN_DIR [key=value ...]`: the run's own job, with only resumable changes."""
    from .errors import UserError
    from .launch.run import run_job
    from .roles.coordinator import RESUMABLE_CHANGES

    if not args or "=" in args[0]:
        print("usage: python -m hpcmarl resume RUN_DIR [key=value ...]", file=sys.stderr)
        return UserError.exit_code
    run_dir, overrides = args[0], args[1:]
    job = os.path.join(run_dir, "config.yaml")
    refused = [o for o in overrides if not o.split("=", 1)[0].startswith(RESUMABLE_CHANGES)]
    problem = "" if os.path.isfile(job) else f"{run_dir} holds no config.yaml: not a run directory"
    if refused:
        problem = (
            f"{', '.join(refused)} cannot change on resume; fix: change only "
            f"{', '.join(RESUMABLE_CHANGES)}, or start a new run"
        )
    if problem:
        print(f"hpcmarl: error: {problem}", file=sys.stderr)
        return UserError.exit_code
    return run_job(job, [*overrides, f"runtime.run_dir={run_dir}"])


if __name__ == "__main__":
    sys.exit(main())
