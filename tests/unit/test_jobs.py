"""The job files in jobs/ load, and the built-in default job is exactly jobs/default.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcmarl.config.loader import job_to_dict, load_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_schema_defaults_are_the_default_job_file() -> None:
    assert job_to_dict(load_job(None)) == job_to_dict(load_job(str(JOBS / "default.yaml")))


@pytest.mark.parametrize("path", sorted(JOBS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_job_file_loads(path: Path) -> None:
    cfg = load_job(str(path))
    assert cfg.name


def test_spread_jobs_differ_only_in_mapping() -> None:
    shared = job_to_dict(load_job(str(JOBS / "spread_shared.yaml")))
    independent = job_to_dict(load_job(str(JOBS / "spread_independent.yaml")))
    assert shared["agents"]["mapping"] == "shared"
    assert independent["agents"]["mapping"] == "independent"
    shared["agents"], independent["agents"] = {}, {}
    shared["name"], independent["name"] = "", ""
    assert shared == independent
