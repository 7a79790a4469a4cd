"""slurm/train.sh on a real cluster: a normal end (mpirun and srun), the time-limit cycle
(signal, checkpoint, exit 75, requeue, resume) at a real time limit for DQN, MAPPO and PSRO and
on a warning sent by hand for QMIX and R2D2, a crash and a spent requeue budget, which are not
requeued, and a first start that refuses another job's run directory.

Every job runs 4 ranks on this 2-core node (`--ntasks=4 --overcommit`) from a scratch working
directory, so the header's `--output=runs/slurm-%j.out` and the default run directory
`runs/hpcmarl-<job id>` land there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .conftest import FINAL_STATES, QUICK, ROOT, SMALL, Job, Submitter

pytestmark = pytest.mark.slow

PROGRESS = "hpcmarl:  "  # the commander's progress lines: training has started


def run_dir(submit: Submitter, job: Job) -> Path:
    return submit.workdir / "runs" / f"hpcmarl-{job.id}"


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_job_that_finishes_exits_0(submit: Submitter, launcher: str) -> None:
    job = submit(SMALL, ["commander.max_env_steps=3000", *QUICK], {"HPCMARL_LAUNCHER": launcher})
    job.wait_final(timeout=150)
    log = job.text()
    job.expect(job.state == "COMPLETED" and job.exit_code == 0, "did not complete with exit 0")
    job.expect("hpcmarl: finished: step budget reached" in log, "no finished line")
    job.expect("hpcmarl-slurm: finished (exit 0)" in log, "no hpcmarl-slurm: finished line")
    job.expect(job.restarts == 0, "was requeued")
    job.expect((run_dir(submit, job) / "config.yaml").is_file(), "no runs/hpcmarl-<id>")
    job.expect("topology for 4 rank(s)" in log, f"{launcher} did not start 4 ranks of one world")


def requeued_once(job: Job) -> str:
    """The job's log, once it is known to have been requeued once and then to have finished."""
    job.expect(job.state in FINAL_STATES, "not finished within the cycle's deadline")
    job.expect(job.restarts == 1, f"requeued {job.restarts} times instead of once")
    job.expect(job.state == "COMPLETED" and job.exit_code == 0, "resumed run did not exit 0")
    return job.text()


def test_time_limit_checkpoints_requeues_and_resumes(time_limited: dict[str, Job]) -> None:
    # The warning's timing is TimeLimitCycle's: 30-60 s after the start, 60-90 s before the limit.
    job = time_limited["dqn"]
    log = requeued_once(job)
    for line in (
        "hpcmarl-slurm: job {id} restart 0",
        "hpcmarl-slurm: got SIGUSR1",
        "hpcmarl: finished: interrupted by SIGUSR1; checkpointed at the time limit",
        "hpcmarl-slurm: checkpointed at the time limit: requeueing job {id} (restart 1 of 10)",
        "hpcmarl-slurm: job {id} restart 1",
        "hpcmarl: resumed from checkpoint",
        "hpcmarl: finished: wall-time limit reached",
        "hpcmarl-slurm: finished (exit 0)",
    ):
        job.expect(line.format(id=job.id) in log, f"no line {line!r} (log appended across runs)")
    job.expect(log.index("restart 0") < log.index("resumed from"), "runs out of order")
    run = job.log.parent / f"hpcmarl-{job.id}"
    job.expect((run / "checkpoints" / "latest").exists(), "no checkpoint")


def test_mappo_checkpoints_at_the_time_limit_and_resumes(time_limited: dict[str, Job]) -> None:
    """The on-policy path through the same cycle: its queues and the commander's books of
    fragments are in the checkpoint, and the requeued job trains on where it stopped."""
    job = time_limited["mappo"]
    log = requeued_once(job)
    for line in ("hpcmarl: resumed from checkpoint", "hpcmarl: finished: wall-time limit reached"):
        job.expect(line in log, f"no line {line!r}")
    job.expect("group shared (policies shared)" in log, "not the MAPPO job")


def test_psro_checkpoints_at_the_time_limit_and_resumes_the_same_iteration(
    time_limited: dict[str, Job],
) -> None:
    """A PSRO job through the same cycle: the registry, the payoff table and the iteration's
    progress are in the checkpoint, and the requeued job continues the iteration it was in."""
    job = time_limited["psro"]
    log = requeued_once(job)
    for line in ("hpcmarl: resumed from checkpoint", "hpcmarl: finished: wall-time limit reached"):
        job.expect(line in log, f"no line {line!r}")
    iterations = [int(m) for m in re.findall(r"hpcmarl: psro iteration (\d+):", log)]
    job.expect(iterations[:2] == [0, 1], f"no PSRO iterations in the log: {iterations}")
    job.expect(iterations == sorted(set(iterations)), f"an iteration ran twice: {iterations}")
    resumed = log[log.index("hpcmarl: resumed from checkpoint") :]
    job.expect("psro iteration" in resumed, "the resumed job finished no PSRO iteration")


def updates_so_far(log: str) -> int:
    """Learner updates in the last progress line of `log` (0 before the first)."""
    counts = re.findall(r"updates +([\d,]+) \(", log)
    return int(counts[-1].replace(",", "")) if counts else 0


@pytest.mark.parametrize("job_file", ["spread_qmix.yaml", "cartpole_novel_r2d2.yaml"])
def test_a_team_or_sequence_job_checkpoints_on_the_warning_and_resumes(
    submit: Submitter, job_file: str
) -> None:
    """QMIX's episode tables and R2D2's prioritized sequences with their recurrent states
    through the cycle: Slurm's warning to the batch shell (what `--signal=B:USR1@N` sends, here
    once the learners train), a checkpoint, exit 75, a requeue, and a resumed run in the same
    run directory that trains on to its budget. The budget (training clock, which the resumed
    run continues) is twice what a loaded node took to the first update: with 20 s, a QMIX run
    whose learners began at 15 s was cut at 18.6 s and its resumed run ended before updating."""
    budget = ["commander.max_wall_time_s=36", "commander.max_env_steps=10000000", *QUICK]
    job = submit(SMALL, budget, job_file=ROOT / "jobs" / job_file)
    job.wait(lambda j: updates_so_far(j.text()) > 0 or j.state in FINAL_STATES, 150, "training")
    subprocess.run(["scancel", "--batch", "--signal=USR1", job.id], check=True)
    job.wait_final(timeout=240)
    log = requeued_once(job)
    for line in (
        "hpcmarl-slurm: got SIGUSR1",
        "hpcmarl: finished: interrupted by SIGUSR1",
        f"hpcmarl-slurm: checkpointed at the time limit: requeueing job {job.id}",
        "hpcmarl: resumed from checkpoint",
        "hpcmarl: finished: wall-time limit reached",
    ):
        job.expect(line in log, f"no line {line!r}")
    cut = log.index("hpcmarl: resumed from checkpoint")
    job.expect(
        updates_so_far(log[cut:]) > updates_so_far(log[:cut]), "the resumed run made no update"
    )


def test_crash_is_not_requeued(submit: Submitter) -> None:
    job = submit(SMALL, ["env.id=NoSuchEnv-v0", *QUICK])
    job.wait_final(timeout=120)
    log = job.text()
    job.expect(job.state == "FAILED" and job.exit_code == 2, "did not fail with the user error")
    job.expect(job.restarts == 0, "a crash was requeued")
    job.expect("hpcmarl-slurm: crashed (exit 2): not requeued" in log, "no crashed line")


def test_term_checkpoints_but_spent_budget_is_not_requeued(submit: Submitter) -> None:
    # A TERM to the batch shell (`--signal=B:TERM@N`, `scancel --batch`) is written down for
    # the commander as USR1 is.
    job = submit(SMALL, ["commander.max_env_steps=10000000", *QUICK], {"HPCMARL_MAX_REQUEUES": "0"})
    job.wait(lambda j: PROGRESS in j.text() or j.state in FINAL_STATES, 120, "training")
    subprocess.run(["scancel", "--batch", "--signal=TERM", job.id], check=True)
    job.wait_final(timeout=90)
    log = job.text()
    job.expect(job.state == "FAILED" and job.exit_code == 75, "did not end with 75")
    job.expect(job.restarts == 0, "requeued with HPCMARL_MAX_REQUEUES=0")
    job.expect("hpcmarl-slurm: got SIGTERM" in log, "TERM not forwarded")
    job.expect("hpcmarl: finished: interrupted by SIGTERM" in log, "no checkpoint on TERM")
    job.expect("hpcmarl-slurm: checkpointed, but not requeued: 0 of 0" in log, "no budget line")


def test_first_start_refuses_an_existing_run_dir(submit: Submitter) -> None:
    # Job ids restart on a reinstalled cluster; a new job must not resume an old one's run.
    job = submit([*SMALL, "--hold"], ["commander.max_env_steps=3000", *QUICK])
    run_dir(submit, job).mkdir()
    subprocess.run(["scontrol", "release", job.id], check=True)
    job.wait_final(timeout=60)
    job.expect(job.state == "FAILED" and job.exit_code == 2, "started in a stale run directory")
    job.expect("already exists from an earlier job" in job.text(), "no stale-run-dir line")
