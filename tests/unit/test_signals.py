"""The commander's signal flags: a signal the batch script wrote down counts as received."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpcmarl.__main__ import resume
from hpcmarl.launch import run, signals
from hpcmarl.roles.commander import EXIT_CHECKPOINTED


@pytest.fixture(autouse=True)
def no_flags():
    signals.clear()
    yield
    signals.clear()


def test_a_written_down_signal_is_received_once_and_its_file_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".slurm-signal"
    monkeypatch.setenv(signals.SIGNAL_FILE_ENV, str(path))
    assert signals.requested() == ""  # no file yet
    path.write_text("SIGTERM\n")
    signals.clear()  # also lets the next call look at the file at once
    assert signals.requested() == "SIGTERM"
    assert not path.exists()
    assert signals.requested() == "SIGTERM"  # a flag, kept until cleared


def test_without_the_setting_no_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(signals.SIGNAL_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".slurm-signal").write_text("SIGUSR1")
    assert signals.requested() == ""


def test_a_signal_before_the_roles_are_built_stops_at_once_and_a_restart_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM while rank 0 probes the env (its module sends it as it is imported): the job
    went on to build its roles and checkpoint an untrained run; now it stops at once, saying
    that nothing was lost, with the code a batch script requeues. The restart it names runs."""
    (tmp_path / "term_on_import.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(signals.SIGNAL_FILE_ENV, raising=False)
    run_dir = tmp_path / "run"
    job = [
        "env.id=term_on_import:CartPole-v1",
        "commander.stop_value=null",
        "commander.max_env_steps=200",
        "topology.collectors=1",
        f"runtime.run_dir={run_dir}",
    ]
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signals.install()  # as python -m hpcmarl does first
    try:
        code = run.run_job(None, job)
        out, err = capsys.readouterr()
        assert code == EXIT_CHECKPOINTED, err
        assert (
            "hpcmarl: stopped by SIGTERM during start-up, before any training: nothing was "
            f"lost; start it again (python -m hpcmarl resume {run_dir})\n"
            f"hpcmarl: run directory: {run_dir}\n"  # the end names it, as the start did
        ) in err
        assert f"hpcmarl: run directory: {run_dir}\n" in out
        assert not (run_dir / "checkpoints").exists()
        signals.clear()
        assert resume([str(run_dir)]) == 0  # the module is imported once: no signal now
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert (run_dir / "checkpoints" / "latest").exists()
