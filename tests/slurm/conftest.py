"""A real single-node Slurm cluster (tools/install_slurm.sh) and jobs submitted to it.

Every wait on the cluster polls `scontrol` against a deadline; a job that misses it fails the
test with its log. Jobs still queued or running when a test ends are cancelled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "slurm" / "train.sh"
JOB = ROOT / "jobs" / "cartpole_dqn.yaml"
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def _unavailable() -> str:
    """Why this machine cannot host the test cluster, or '' when it can."""
    if os.geteuid() != 0:
        return "needs root (installs slurm-wlm and munge, starts slurmctld, slurmd and munged)"
    if shutil.which("sbatch") is None and not (shutil.which("apt-get") and shutil.which("dpkg")):
        return "Slurm is not installed and apt-get/dpkg are unavailable to install it"
    return ""


def start_cluster() -> str:
    """Install (when missing) and start the cluster; idempotent. What went wrong, or ''."""
    if os.environ.get("HPCMARL_SLURM_ETC"):
        os.environ["SLURM_CONF"] = os.path.join(os.environ["HPCMARL_SLURM_ETC"], "slurm.conf")
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "install_slurm.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return f"tools/install_slurm.sh failed:\n{done.stdout}\n{done.stderr}"
    return ""


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """Installs (when missing) and starts the cluster once per session."""
    reason = _unavailable()
    if reason and os.environ.get("CI") == "true":
        pytest.fail(f"tests/slurm cannot run under CI: {reason}")
    if reason:
        pytest.skip(reason)
    problem = start_cluster()
    if problem:
        pytest.fail(problem)


@dataclass
class Job:
    """One submitted batch job: its id, its log and the last state `scontrol` showed."""

    id: str
    log: Path
    info: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] | None = None
    """The environment of its Slurm commands (SLURM_CONF picks the cluster); None: this one's."""

    @property
    def state(self) -> str:
        return self.info.get("JobState", "")

    @property
    def restarts(self) -> int:
        return int(self.info.get("Restarts", "0"))

    @property
    def exit_code(self) -> int:
        """The batch script's exit code (`ExitCode=code:signal`)."""
        return int(self.info.get("ExitCode", "0:0").split(":")[0])

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def refresh(self) -> dict[str, str]:
        """The job as `scontrol` shows it now; the last state once it has left the queue."""
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", self.id],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env,
        )
        if shown.returncode == 0:
            self.info = dict(w.split("=", 1) for w in shown.stdout.split() if "=" in w)
        return self.info

    def wait(self, until: Callable[[Job], bool], timeout: float, what: str) -> None:
        """Polls once a second until `until(self)`; fails with the log past the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.refresh()
            if until(self):
                return
            time.sleep(1.0)
        self.fail(f"not {what} within {timeout:.0f}s")

    def wait_final(self, timeout: float) -> None:
        self.wait(lambda j: j.state in FINAL_STATES, timeout, "finished")

    def fail(self, problem: str) -> None:
        pytest.fail(
            f"job {self.id}: {problem}; state {self.state} restarts {self.info.get('Restarts')} "
            f"exit {self.info.get('ExitCode')} reason {self.info.get('Reason')}\n"
            f"--- {self.log} ---\n{self.text()[-6000:]}"
        )

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.fail(problem)


class Submitter:
    """`sbatch` from a scratch folder (the job's working directory) with an absolute script;
    `env` is added to every Slurm command's environment (SLURM_CONF: another cluster)."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = {**os.environ, **env} if env else None
        (workdir / "runs").mkdir(exist_ok=True)  # the header's --output=runs/slurm-%j.out
        self.jobs: list[Job] = []

    def __call__(
        self,
        options: list[str],
        args: list[str],
        env: dict[str, str] | None = None,
        job_file: Path = JOB,
    ) -> Job:
        full_env = {**(self.env or os.environ), **(env or {})}
        cmd = ["sbatch", "--parsable", *options, str(TRAIN), str(job_file), *args]
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, env=full_env, cwd=self.workdir
        )
        if done.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed: {done.stderr}")
        job_id = done.stdout.strip().split(";")[0]
        job = Job(job_id, self.workdir / "runs" / f"slurm-{job_id}.out", env=self.env)
        self.jobs.append(job)
        return job

    def cancel_all(self) -> None:
        ids = [j.id for j in self.jobs]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60, env=self.env)


@pytest.fixture
def submit(slurm_cluster: None, tmp_path: Path) -> Iterator[Submitter]:
    """Submits jobs whose working directory is this test's tmp_path; cancels them at the end."""
    submitter = Submitter(tmp_path)
    try:
        yield submitter
    finally:
        submitter.cancel_all()


SMALL = ["--ntasks=4", "--overcommit"]
QUICK = ["commander.stop_value=null", "topology.collectors=2"]
PSRO_SHORT_ITERATIONS = [
    "psro.steps_per_iteration=4000",
    "psro.updates_per_iteration=250",
    "psro.eval_episodes=200",
]
"""A quarter of kuhn_psro's iteration: the test needs iterations to end on both sides of the
requeue, and in CI a loaded node trained 1,900 updates in the resumed run's 40 s, short of the
job file's 2 x 1,000 for one iteration."""
TIME_LIMITED = {
    "dqn": (JOB, 75, []),
    "mappo": (ROOT / "jobs" / "spread_mappo.yaml", 70, ["runtime.print_wiring=full"]),
    "psro": (ROOT / "jobs" / "kuhn_psro.yaml", 70, PSRO_SHORT_ITERATIONS),
}
"""The time-limit cycle's jobs: a job file each, its budget on the training clock (which a
resumed run continues), more than a first allocation can do before its warning (60 s at most),
and its own overrides (the MAPPO job prints its groups: the test checks it runs that job)."""


class TimeLimitCycle:
    """The three time-limit jobs, submitted together as soon as the session has collected them
    and run side by side (the partition lets jobs share cores) while the rest of the suite
    runs: each mostly waits for its first limit. Every one must checkpoint at the signal,
    exit 75 and be requeued once; each requeued run gets 4 minutes at once, so it finishes
    inside one allocation with no second signal cycle.

    slurmctld looks at time limits every 30 s and sends the warning at the first look with
    `now + 30 + lead >= end`: with a 2-minute limit and a 60 s lead it lands 30-60 s after the
    start and 60-90 s before the limit. The lead is what a loaded node needs: in CI twelve ranks
    starting beside the suite's own MPI tests on 2 cores had not printed a line 25 s or more
    after their start, and with a 5 s lead (a 1-minute limit) the limit killed all three jobs
    after their checkpoint, before they could exit 75."""

    FIRST_LIMIT_MIN = 2
    LEAD_S = 60
    DEADLINE_S = 480

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.problem = ""
        self.workdir: Path | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slurm-time-limit", daemon=True)
            self._thread.start()

    def result(self) -> dict[str, Job]:
        """The jobs once all have finished (or the deadline passed); fails on a set-up error."""
        self.start()
        assert self._thread is not None
        self._thread.join(timeout=self.DEADLINE_S + 660)
        if self.problem:
            pytest.fail(self.problem)
        return self.jobs

    def cancel(self) -> None:
        ids = [job.id for job in self.jobs.values()]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)

    def _run(self) -> None:
        try:
            self.problem = _unavailable() or start_cluster()
            if self.problem:
                return
            self.workdir = Path(tempfile.mkdtemp(prefix="hpcmarl-time-limit-"))
            submit = Submitter(self.workdir)
            for name, (job_file, budget, overrides) in TIME_LIMITED.items():
                self.jobs[name] = submit(
                    [*SMALL, f"--time={self.FIRST_LIMIT_MIN}", f"--signal=B:USR1@{self.LEAD_S}"],
                    [f"commander.max_wall_time_s={budget}", "commander.max_env_steps=10000000"]
                    + QUICK
                    + overrides,
                    job_file=job_file,
                )
            self._see_through()
        except BaseException as err:  # noqa: BLE001 - reported by the tests that wait on it
            self.problem = f"the time-limit jobs could not be run: {err!r}"

    def _see_through(self) -> None:
        extended: set[str] = set()
        deadline = time.monotonic() + self.DEADLINE_S
        while time.monotonic() < deadline:
            for job in self.jobs.values():
                job.refresh()
                if job.restarts >= 1 and job.id not in extended:
                    update = ["scontrol", "update", f"JobId={job.id}", "TimeLimit=4"]
                    subprocess.run(update, check=True, capture_output=True, timeout=60)
                    extended.add(job.id)
            if all(job.state in FINAL_STATES for job in self.jobs.values()):
                return
            time.sleep(1.0)


TIME_LIMIT_CYCLE = TimeLimitCycle()


def start_time_limit_cycle(session: pytest.Session) -> None:
    """Start the time-limit jobs (once) when the session will check them."""
    if any("time_limited" in getattr(item, "fixturenames", ()) for item in session.items):
        TIME_LIMIT_CYCLE.start()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Without xdist, the jobs start as soon as collection ends. Under xdist every worker
    collects the whole suite, so only the one that runs the Slurm tests starts them, at its
    first test of their group (tests/conftest.py)."""
    if "PYTEST_XDIST_WORKER" not in os.environ and not session.config.option.collectonly:
        start_time_limit_cycle(session)


@pytest.fixture(scope="session")
def time_limited(slurm_cluster: None) -> Iterator[dict[str, Job]]:
    """The finished time-limit jobs (`TimeLimitCycle`), by name."""
    try:
        yield TIME_LIMIT_CYCLE.result()
    finally:
        TIME_LIMIT_CYCLE.cancel()
