"""The commander's signal flags: a signal the batch script wrote down counts as received."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmarl.launch import signals


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
