"""Running commands under the real `mpirun` of the virtualenv, always with a hard timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = ROOT / "tools" / "mpirun.sh"
VENV = str(Path(sys.executable).parent.parent)
"""The virtualenv running the tests; its mpirun launches them (Open MPI's or MPICH's)."""


def run_mpi(
    ranks: int, args: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`mpirun -n ranks python ARGS`; a hang fails the test instead of the suite."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV, **(env or {})}
    cmd = ["bash", str(MPIRUN), "-n", str(ranks), sys.executable, *args]
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"mpirun -n {ranks} {' '.join(args)} hung past {timeout}s:\n"
            f"{(exc.stdout or b'')[-3000:]!r}\n{(exc.stderr or b'')[-3000:]!r}"
        )


def run_local(
    args: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """One plain process, no mpirun."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd or ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"python {' '.join(args)} hung past {timeout}s:\n{(exc.stdout or b'')[-3000:]!r}"
        )


@contextlib.contextmanager
def interrupts_deliverable() -> Iterator[None]:
    """A job started inside takes SIGINT as a terminal's foreground job does, also where the
    suite itself runs with SIGINT ignored (started in the background by a non-interactive
    shell, as CI may be): an ignored signal is inherited, and tools/mpirun.sh, a shell, cannot
    trap one ignored on entry, so Ctrl-C to the job's process group reached no rank (a
    clean-clone run of the suite hung in test_interrupts that way)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    in_main = threading.current_thread() is threading.main_thread()
    if ignored and in_main:  # a handler of our own is reset to the default in the child
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored and in_main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_in_background(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """`cmd` in a session of its own (its process group takes the test's signals), output
    piped, able to take SIGINT."""
    with interrupts_deliverable():
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


class BackgroundJob:
    """`mpirun -n ranks python -m hpcmarl ARGS` running while a test acts on it (signals,
    kills); every wait is bounded, and a job left running is killed with its process group."""

    def __init__(
        self,
        ranks: int,
        args: list[str],
        wrapper: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`wrapper` runs each rank's command (e.g. a script recording its exit code)."""
        hpcmarl = [sys.executable, "-m", "hpcmarl", *args]
        cmd = ["bash", str(MPIRUN), "-n", str(ranks), *(wrapper or []), *hpcmarl]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCMARL_VENV": VENV, **(env or {})}
        self.proc = start_in_background(cmd, full_env)

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ready():
            time.sleep(0.5)
        if not ready():
            self.kill()
            pytest.fail(f"{what} did not happen within {timeout:g} s")

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, timeout: float, what: str) -> tuple[str, str]:
        """The job's stdout and stderr once it has ended; a job that does not end fails."""
        try:
            return self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job hung: {what}")

    def kill(self) -> None:
        """mpirun.sh runs mpirun in a process group of its own: both groups are killed."""
        for child in children(self.proc.pid):
            try:
                os.killpg(child, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode


def children(pid: int) -> list[int]:
    """The pids of a process's children (Linux /proc; none elsewhere)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def progress_rows(run_dir: Path, at_least: int) -> Callable[[], bool]:
    """A readiness check: the run has written `at_least` progress rows."""
    progress = run_dir / "progress.csv"
    return lambda: progress.exists() and len(progress.read_text().splitlines()) > at_least
