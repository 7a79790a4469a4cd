"""`python -m hpcmarl scale RUN_DIR collectors=-2`: change how many collectors a running job uses.

The request travels as a file in the run directory (`control/`), the way Slurm's warning
reaches the commander: no port, no daemon, and any host that sees the run directory can ask.
The commander reads the folder about once a second, acts (DI-engine's
`decrease_collector_task_space` / `increase_collector_task_space`), says what it did on the
run's output and in `metrics.jsonl` (a `scale` row), and removes the file.

A retired collector finishes the task in hand and takes no other; its rank idles until the job
ends. `collectors=+N` puts retired collectors back to work; ranks beyond the job's own are not
added yet.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from .run_lock import LOCK_NAME, is_run_dir

CONTROL_DIR = "control"
REQUEST = re.compile(r"^collectors=([+-]\d+)$")
USAGE = "usage: python -m hpcmarl scale RUN_DIR collectors=+N|-N"


def scale_main(args: list[str]) -> int:
    """Write the request for the job running in RUN_DIR; exit 2 with one line if it cannot."""
    if len(args) != 2 or not REQUEST.match(args[1]):
        print(USAGE, file=sys.stderr)
        return 2
    run_dir, (delta_text,) = args[0], REQUEST.match(args[1]).groups()  # type: ignore[union-attr]
    problem = refusal(run_dir)
    if problem:
        print(f"hpcmarl: error: {problem}", file=sys.stderr)
        return 2
    path = write_request(run_dir, {"collectors": int(delta_text)})
    print(
        f"hpcmarl: asked the job in {run_dir} for collectors {delta_text} ({path}); "
        "the job's output says what it did"
    )
    return 0


def refusal(run_dir: str) -> str:
    """Why no job in `run_dir` can take a request, or the empty string."""
    if not os.path.isdir(run_dir) or not is_run_dir(run_dir):
        return f"{run_dir} is not a run directory (no config.yaml and marker of a run)"
    try:
        with open(os.path.join(run_dir, LOCK_NAME)) as fh:
            holder = fh.read().strip()
    except OSError:
        holder = ""
    if not holder:
        return f"no job is running in {run_dir}: it ended (resume it with python -m hpcmarl resume)"
    return ""


def write_request(run_dir: str, request: dict) -> str:
    """One file per request, written whole before it appears under its final name."""
    folder = os.path.join(run_dir, CONTROL_DIR)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{time.time_ns()}-{os.getpid()}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(request, fh)
    os.replace(path + ".tmp", path)
    return path


def take_requests(run_dir: str) -> list[dict]:
    """The requests waiting in `run_dir`, oldest first, each removed once read; a file that is
    not a request is removed with it, named in a `{"error": ...}` entry."""
    folder = os.path.join(run_dir, CONTROL_DIR)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError:
        return []
    requests = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path) as fh:
                request = json.load(fh)
            if not isinstance(request, dict) or not isinstance(request.get("collectors"), int):
                raise ValueError('expected {"collectors": N}')
        except (OSError, ValueError) as err:
            request = {"error": f"{path}: {err}"}
        requests.append(request)
        try:
            os.remove(path)
        except OSError:
            pass
    return requests
