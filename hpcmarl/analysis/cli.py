"""`python -m hpcmarl analyze ...` and `python -m hpcmarl export ...`.

Every problem with the input (missing, truncated, corrupt or foreign file, missing column,
unknown agent) ends with one line `hpcmarl: error: <cause>; fix: <fix>` and exit code 2, never
a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ..errors import UserError
from .episodes import EpisodeRecords
from .reader import Source
from .summary import CHUNK_ROWS, EpisodeSink, analyze

EXAMPLES = """examples:
  python -m hpcmarl analyze runs/cartpole                 its replay logs (or newest checkpoint)
  python -m hpcmarl analyze runs/x/replay/collector0.h5 --json
  python -m hpcmarl export runs/x/replay/collector0.h5 --format minari --out data/cartpole"""


def analyze_main(argv: list[str]) -> int:
    """Summarise replay files in the terminal, `report.md`, plots and `episodes.jsonl`."""
    args = _analyze_parser().parse_args(argv)
    return guarded(lambda: _analyze(args))


def export_main(argv: list[str]) -> int:
    """Write one agent's transitions in the Minari or D4RL layout."""
    args = _export_parser().parse_args(argv)
    return guarded(lambda: _export(args))


def _analyze_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpcmarl analyze",
        description="Summarise replay logs and checkpoint replay tables.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="RUN_DIR_OR_FILE")
    p.add_argument(
        "--out",
        help="folder for report.md, plots and episodes.jsonl "
        "(default: RUN_DIR/analysis, or <file>-analysis beside a file)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS, help=argparse.SUPPRESS)
    return p


def _export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hpcmarl export",
        description="Export one agent's transitions, or a team's episodes, from a replay file.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", metavar="FILE")
    p.add_argument("--format", required=True, choices=("minari", "d4rl"))
    p.add_argument("--agent", help="agent id (name or number); needed for multi-agent files")
    p.add_argument(
        "--team",
        action="store_true",
        help="minari: one episode per env episode with every agent's data (Dict spaces)",
    )
    p.add_argument("--out", help="output path (default: beside FILE)")
    p.add_argument("--chunk-rows", type=int, default=CHUNK_ROWS, help=argparse.SUPPRESS)
    return p


def guarded(body: Callable[[], int]) -> int:
    try:
        return body()
    except UserError as err:
        print(f"hpcmarl: error: {err.message()}", file=sys.stderr)
        return UserError.exit_code
    except OSError as err:  # the output folder: permissions, a full disk
        where = f" {err.filename}" if err.filename else ""
        print(
            f"hpcmarl: error: cannot write{where} ({err.strerror}); fix: choose another "
            "--out or free space",
            file=sys.stderr,
        )
        return UserError.exit_code


def _analyze(args: argparse.Namespace) -> int:
    from .learners import learner_summary
    from .plots import pyplot, write_plots
    from .psro import psro_summary
    from .report import render

    if not args.no_plots:
        pyplot()  # a missing analysis extra ends here, before the files are read
    out = Path(args.out) if args.out else default_out(args.paths)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "episodes.jsonl", "w") as episodes:
        summary = analyze(args.paths, args.chunk_rows, episode_writer(episodes))
    summary["psro"] = psro_summary(args.paths)
    summary["learners"] = learner_summary(args.paths)
    plots = [] if args.no_plots else write_plots(summary, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "report.md").write_text(render(summary, plots))
    if args.json:
        print(json.dumps(summary))
    else:
        print(render(summary))
    print(f"hpcmarl: report, plots and episodes in {out}/", file=sys.stderr)
    return 0


def default_out(paths: list[str]) -> Path:
    """RUN_DIR/analysis for a run directory, <file>-analysis beside a single file."""
    first = Path(paths[0])
    if first.is_dir():
        return first / "analysis"
    if len(paths) == 1:
        return first.with_name(f"{first.stem}-analysis")
    return first.parent / "analysis"


def episode_writer(stream: TextIO) -> EpisodeSink:
    """A sink writing one JSON line per complete episode: id, length, team and agent returns."""

    def write(source: Source, rec: EpisodeRecords) -> None:
        team = rec.team_returns
        for i in range(len(rec)):
            held = rec.rows[i] > 0
            row = {
                "source": source.label,
                "episode_id": int(rec.ids[i]),
                "length": int(rec.last[i]) + 1,
                "return": float(team[i]),
                "agent_returns": {
                    source.agents[k]: float(rec.returns[i, k]) for k in held.nonzero()[0]
                },
            }
            stream.write(json.dumps(row) + "\n")

    return write


def _export(args: argparse.Namespace) -> int:
    from .export import export

    result = export(args.path, args.format, args.agent, args.out, args.chunk_rows, args.team)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    commands = {"analyze": analyze_main, "export": export_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m hpcmarl.analysis.cli {analyze,export} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
