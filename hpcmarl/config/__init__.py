"""Job configuration: the schema, loading YAML and overrides into it, and explaining it."""

from hpcmarl.config.loader import (
    apply_overrides,
    explain,
    field_help,
    job_from_dict,
    job_to_dict,
    load_job,
    save_resolved,
)
from hpcmarl.config.schema import (
    AgentsConfig,
    CollectorConfig,
    CommanderConfig,
    EnvConfig,
    JobConfig,
    LearnerConfig,
    ReplayConfig,
    RuntimeConfig,
    TopologyConfig,
)

__all__ = [
    "AgentsConfig",
    "CollectorConfig",
    "CommanderConfig",
    "EnvConfig",
    "JobConfig",
    "LearnerConfig",
    "ReplayConfig",
    "RuntimeConfig",
    "TopologyConfig",
    "apply_overrides",
    "explain",
    "field_help",
    "job_from_dict",
    "job_to_dict",
    "load_job",
    "save_resolved",
]
