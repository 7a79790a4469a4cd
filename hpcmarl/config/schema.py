"""The job schema: every setting a job file may hold, with its meaning and its default.

A job file is YAML whose sections mirror these dataclasses. Each field carries a docstring so
that `python -m hpcmarl --explain` and error messages can say what a key is for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from hpcmarl.algos import catalog

Section = TypeVar("Section", bound=type)

ENV_FAMILIES = ("gymnasium", "pettingzoo", "openspiel")
"""The values of `env.kind`; `envs.registry.ENV_KINDS` makes each (kept light: no env imports)."""


@dataclass
class EnvConfig:
    """Which environment the collectors and the evaluator run."""

    kind: str = "gymnasium"
    """Environment family: `gymnasium` (one agent), `pettingzoo` (parallel multi-agent API) or
    `openspiel` (turn-based games, one player acting per step, with legal-action masks)."""
    id: str = "CartPole-v1"
    """Environment id: a gymnasium id, a PettingZoo module such as `mpe2.simple_spread_v3`, or
    an OpenSpiel game name such as `kuhn_poker`."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the environment constructor (an OpenSpiel game's
    parameters)."""
    num_envs: int = 1
    """Environment copies stepped together by each collector (a batched forward pass per step)."""


@dataclass
class AgentsConfig:
    """How environment agents map to trained policies."""

    mapping: Any = "shared"
    """`shared` (every agent acts with one policy), `independent` (one policy per agent) or a
    dict {agent_id: policy_id}."""
    strategy_spec_id: str = "main"
    """Strategy spec whose policies this job trains; weight tables are keyed `{spec}/{policy}`."""
    groups: dict[str, list[str]] = field(default_factory=dict)
    """Training groups: {group: [policy ids]} whose policies one algorithm instance trains
    jointly (a team); empty means one group per policy (independent learners)."""


@dataclass
class ModelConfig:
    """The policies' torso, from observations to features; the algorithms add their heads."""

    torso: str = "mlp"
    """`mlp` (learner.hidden_sizes with the algorithm's activation), `cnn` (Nature-CNN-style
    convolutions for image observations (H, W, C) or (C, H, W), uint8 pixels scaled to [0, 1];
    learner.model.kwargs may set channels, kernels, strides, features, channels_last), or
    `module:function`: your factory, called as function(observation_space,
    **learner.model.kwargs), returning a torch.nn.Module that maps a float32 batch
    [B, *observation_space.shape] to features [B, F]. It is checked at start-up on two sample
    observations; its name and kwargs are saved with each policy, so resume, evaluate, PSRO
    and load_policy rebuild the same network (its module must be importable there too). A
    central critic (mappo) keeps an mlp on the global state."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the torso's factory (none for mlp)."""


def _algorithm_sections(cls: Section) -> Section:
    """Give the class a field per built-in algorithm's own section (`learner.dqn`, ...) as the
    catalog declares them (`algos.catalog.sections`): the algorithms own their keys, beside
    their code, and a new one is a line of the catalog, not a field here."""
    for section, (config, doc) in catalog.sections().items():
        cls.__annotations__[section] = config
        setattr(cls, section, field(default_factory=config, metadata={"doc": doc}))
    return cls


@dataclass
@_algorithm_sections
class LearnerConfig:
    """The learning algorithm, the keys every algorithm shares, and each algorithm's own."""

    algo: str = field(
        default="dqn",
        metadata={
            "doc": "Algorithm name; `python -m hpcmarl --explain` lists them "
            f"({', '.join(catalog.CATALOG)})."
        },
    )
    """Algorithm name, one of the catalog's (`algos.catalog.CATALOG`, its help made from it) or
    a plugin's."""
    lr: float = 1e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 64
    """Items per sampled batch, per learner (off-policy algorithms): transitions, or episodes
    for qmix and vdn."""
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths of the networks."""
    grad_clip: float = 10.0
    """Global gradient-norm clip; 0 disables it."""
    push_interval: int = 10
    """Learner updates between weight pushes to the parameter server (on-policy algorithms push
    after every update)."""
    updates_per_task: int = 200
    """Updates in one learner task granted by the commander (its unit of scheduling; an
    on-policy task is one update). A checkpoint or a stop does not wait for a task's end: an
    off-policy task ends after the update in flight (deterministic mode keeps tasks whole)."""
    allreduce: str = "mpi"
    """Gradient averaging across learners of one group: `mpi`, `horovod`, `torch` or `auto`.
    `torch` averages through torch.distributed, with NCCL on the GPUs when every learner of the
    group trains on one, else with gloo on the host; its processes meet in a file of the run
    directory (`allreduce-<group>.store`, no port to configure). `auto` takes torch with NCCL
    when every learner of the group is on a GPU, else Horovod when it imports, else MPI. The
    default is MPI because Horovod's background thread keeps a core busy per learner, which
    costs more than it saves on oversubscribed nodes."""
    device: str = "auto"
    """Where learners train: `auto` (a GPU of the node when torch sees one: a learner takes its
    index among the learners on its host, modulo the host's GPUs; else the CPU), `cpu`, or
    `cuda` (refused at start-up, naming the host, when a learner's host has none).
    `tools/bench_update.py` says which is faster for a job: small networks update faster on the
    CPU, where a GPU's per-kernel launch costs more than their arithmetic."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The networks' torso (learner.model.torso) and its arguments."""
    drift_check_interval: int = 100
    """Averaged updates between weight-digest comparisons across the learners of a group (a
    mismatch stops the job naming the learners that differ); 0 turns it off."""


@dataclass
class ReplayConfig:
    """Replay tables on the replay shards (one table per training group on every shard)."""

    table_capacity: int = 50_000
    """Items kept per table (one per training group) per shard; the oldest are evicted (and
    counted) beyond it. On-policy queues hold fragments and evict likewise."""
    learning_starts: int = 1_000
    """Items (transitions, or episodes for qmix and vdn) a table must hold before it serves
    samples; 0 is the same as 1 (learning starts with the first item)."""
    prioritized: bool = True
    """Prioritized sampling (sum tree) instead of uniform."""
    alpha: float = 0.6
    """Priority exponent: P(i) = p_i^alpha / sum_k p_k^alpha."""
    beta: float = 0.4
    """Importance-sampling exponent: w_i = (N * P(i))^-beta, normalised by the batch maximum."""
    eps: float = 1e-6
    """Added to |TD error| so that no item gets priority zero."""
    samples_per_insert: float = 64.0
    """Target ratio of sampled to inserted transitions; 0 disables the rate limiter."""
    error_buffer: float = 20_000.0
    """Slack of the samples-per-insert limiter, in transitions, around its target."""
    sequence_length: int = 40
    """Sequence items (r2d2): steps per sequence, burn-in included; a sequence never crosses
    an episode's end (a shorter end is padded, `filled` marking its steps)."""
    burn_in: int = 10
    """Sequence items: first steps of each sequence that only warm up the recurrent state
    (no loss, no gradient)."""
    sequence_overlap: int = 20
    """Sequence items: steps consecutive sequences of an episode share (R2D2: half)."""
    zero_init_states: bool = False
    """Sequence items: start each sequence's recurrent state at zeros instead of the state the
    actor had there (stored with the sequence)."""
    insert_credits: int = 2
    """Batches a collector may have in flight to one shard (back-pressure credits)."""
    stack_num: int = 1
    """MALib's producer option, for replayed items (transitions, episodes, sequences):
    observations are stacks of the run's last k frames. Collectors and evaluations act on them
    (gymnasium envs are stacked for you; with `save_only_last_obs`, the env's own stacks are
    used); tables store each frame once and rebuild the stacks when they sample."""
    ignore_obs_next: bool = False
    """Replayed items: store no `next_observations` (nor, for a mixer, `next_state`); a sample
    rebuilds them from the next step of the same run (an episode's last step, a sequence's
    step after its end, keeps its own)."""
    save_only_last_obs: bool = False
    """Replayed items, for envs whose observations already are stacks of `stack_num` frames
    (first axis): store only the newest frame of each."""


@dataclass
class CollectorConfig:
    """Experience collection."""

    fragment_length: int = 32
    """Environment steps per batch sent to replay (per environment copy)."""
    fragments_per_task: int = 4
    """Fragments in one collector task granted by the commander."""
    weight_sync_fragments: int = 1
    """Fragments between checks with the parameter server for newer weights."""


@dataclass
class CommanderConfig:
    """Scheduling, evaluation and the stop condition."""

    stop_value: float | None = 475.0
    """Stop when the greedy evaluation's mean return reaches this value; null disables it."""
    max_env_steps: int = 300_000
    """Step budget: stop after this many environment steps (all collectors together)."""
    max_wall_time_s: float = 0.0
    """Stop after this many seconds of training; 0 means no wall-time limit. Time the whole job
    spent suspended (`scontrol suspend`, Ctrl-Z: a standstill of the commander's loop of half
    of `runtime.heartbeat_timeout_s` or more, without its CPU time going on) does not count,
    as a Slurm job's time limit leaves it out too; a busy or starved rank 0 does count."""
    max_updates: int = 0
    """Stop after this many learner updates (summed over learners); 0 means no limit."""
    eval_interval_s: float = 5.0
    """Seconds between greedy evaluations."""
    eval_episodes: int = 10
    """Episodes per evaluation; their mean return is compared with `stop_value`."""
    eval_max_episode_steps: int | None = None
    """Steps after which an evaluation episode is cut and counted as truncated, so an env
    whose episodes never end (no time limit) cannot hold up the run's checkpoints and its end;
    null means the env's own time limit, or 10,000 steps for an env without one."""
    stop_evals: int = 1
    """Consecutive evaluations that must reach `stop_value` before the run stops: 2 asks the
    policy to hold the value, not to touch it once (DQN's greedy policy often drops back)."""
    collector_task_space: int = 0
    """Collector tasks that may run at once; 0 means one per collector."""
    progress_interval_s: float = 3.0
    """Seconds between progress lines on stdout (and rows in progress.csv / metrics.jsonl)."""
    deterministic: bool = False
    """Fixed message schedule for bitwise-reproducible runs (slower): in each round every
    collector runs one task in turn (fresh seeded episodes, latest weights), then every learner
    group one task, each learner sampling from its own shard; no rate limiter; a run and its
    resume from any checkpoint end with the same weights and the same `round` metric rows."""
    eval_every_rounds: int = 5
    """In deterministic mode, rounds between evaluations (instead of `eval_interval_s`)."""


@dataclass
class CheckpointConfig:
    """Coordinated HDF5 checkpoints under `RUN_DIR/checkpoints/`."""

    interval_s: float = 300.0
    """Seconds of training between periodic checkpoints; 0 disables the periodic ones."""
    every_updates: int = 0
    """Also checkpoint every this many learner updates (summed over learners); 0 disables it."""
    keep: int = 3
    """Complete checkpoints kept; older ones are deleted."""
    at_end: bool = True
    """Write a checkpoint when the run ends (stop value, step budget, wall-time limit)."""
    timeout_s: float = 120.0
    """Seconds the commander waits for every role to write its part before failing the run
    (at least 10: the cut itself waits for the tasks in flight to end)."""


@dataclass
class ReplayLogConfig:
    """Trajectories written by collectors as HDF5 replay files, for offline analysis."""

    enabled: bool = False
    """Write every fragment each collector produces to `RUN_DIR/replay/<collector>.h5`."""
    flush_every_fragments: int = 10
    """Fragments between flushes: a killed job keeps every flushed row readable."""


@dataclass
class OfflineConfig:
    """Training from recorded data instead of environment interaction."""

    dataset: str = ""
    """A replay file (a collector's replay log or a checkpoint's `replay<N>.h5`), or a run
    directory holding them, that fills the replay shards in place of collectors; collectors
    then only run the greedy evaluations. Empty means online training. Needs
    commander.max_updates or commander.max_wall_time_s to stop."""


@dataclass
class PSROConfig:
    """Policy-Space Response Oracles over a population of policies per player (two-player
    OpenSpiel games such as kuhn_poker): each iteration trains one new best response per player
    against the others' meta-strategy, evaluates the new matchups, solves the meta-game."""

    enabled: bool = False
    """Run PSRO instead of training one fixed set of policies."""
    iterations: int = 20
    """PSRO iterations (best responses per player) before the run stops; 0 means no limit."""
    steps_per_iteration: int = 20_000
    """Environment steps collected for the new best responses in one iteration (all players;
    an off-policy oracle's: PPO's steps follow from its updates, each on fresh fragments)."""
    updates_per_iteration: int = 2_000
    """Learner updates per training group (player) in one iteration (PPO: each on
    learner.ppo.batch_fragments fresh fragments)."""
    meta_solver: str = "nash"
    """How the meta-strategy is solved from the payoff matrix: nash (linear program, two-player
    zero-sum), uniform (fictitious play) or prd (projected replicator dynamics)."""
    eval_episodes: int = 1_000
    """Evaluation episodes per payoff-matrix entry (one matchup of policies)."""
    exploitability: bool = True
    """Compute the meta-strategy's exploitability with OpenSpiel after every iteration."""
    stop_exploitability: float | None = None
    """Stop once the exploitability is at most this; null disables it."""


@dataclass
class TopologyConfig:
    """How many of each role the job wants. Placement follows from the world size and, across
    hosts, from each rank's host and GPUs (`launch/host_placement.py`)."""

    param_servers: int = 1
    """Parameter-server roles."""
    replay_shards: int = 2
    """Replay-shard roles."""
    learners: int = 2
    """Learner roles (learners of one policy average their gradients)."""
    collectors: int | Literal["auto"] = "auto"
    """Collector roles, or auto: one collector on every rank the other roles leave free (so a
    batch allocation of any size has every rank working: 128 ranks and the default roles give
    122 collectors), and never fewer than 10, the default layout's count, which a world too
    small for them co-locates as an explicit count would (one process, or `mpirun -n 8`). With
    topology.colocate=false, auto is exactly the free ranks."""
    colocate: bool = True
    """Let a world smaller than the role count host several roles per rank; when false such a
    world is refused."""


@dataclass
class RuntimeConfig:
    """Process-level settings."""

    run_dir: str = ""
    """Run directory; empty means `runs/<job name>-<timestamp>`."""
    torch_threads: int = 1
    """Torch threads per rank (16 ranks often share a few cores)."""
    print_wiring: Literal["short", "full"] = "short"
    """What rank 0 prints of the wiring at start: short is one line per host naming its ranks
    and roles (one line per rank when all run on one host) and any placement notes; full adds
    each rank's roles, the training groups and their learners, every route between roles and
    the message table."""
    idle_sleep_max_s: float = 0.002
    """Longest sleep of an idle rank's backoff."""
    idle_wait_s: float = 0.05
    """Longest wait of an idle rank for a message from a peer on its host, which wakes it
    (a doorbell) instead of the rank polling every `idle_sleep_max_s`; 0 turns this off."""
    shutdown_timeout_s: float = 20.0
    """Seconds the commander waits for roles to acknowledge stop before aborting."""
    heartbeat_interval_s: float = 2.0
    """Seconds between heartbeats of every role to the commander."""
    heartbeat_timeout_s: float = 120.0
    """A role silent this long (no heartbeat, no message) makes the commander abort the job,
    naming it; generous by default because 16 ranks on few cores start slowly. When the
    commander's own loop stood still for half of it (the whole job suspended: `scontrol
    suspend`, Ctrl-Z), every role's clock restarts instead, with a line saying so."""
    fault_tolerance: Literal["none", "collectors"] = "none"
    """What a run survives: none ends the job when any rank dies (then resume from the newest
    checkpoint); collectors goes on without a rank that hosted collectors only, releasing its
    task and shrinking the collector task space. It needs Open MPI's fault tolerance, which
    `tools/mpirun.sh` (and so `slurm/train.sh`) turns on (`mpirun --with-ft ulfm`) for a job
    that sets this key, in its job file or on the command line;
    elsewhere (MPICH, `srun`, mpirun without it) the job fails fast and says so at start."""
    respawn_collectors: bool = False
    """Under `fault_tolerance: collectors`, replace a lost collector rank during the run: the
    ranks left spawn a new one (`MPI_Comm_spawn`, launch/respawn_run.py) that hosts the lost
    rank's collectors, pulls weights and takes tasks again; a collector lost once the job's
    stop has begun is not replaced. Off by default for now: a replacement that dies ends the
    job (Open MPI's spawned ranks are not fault tolerant), and a spawn on another host is
    untested (docs/failure-modes.md). False goes on with the collectors left."""
    stall_timeout_s: float | None = 300.0
    """A run whose env steps and learner updates both stay still this long (every role alive,
    but each waiting on another) fails with what waits on what: the tasks running, the roles
    waiting for one, and what each replay shard's limiters refuse; null disables it. At least
    30: the commander sees env steps as tasks end, and a large job starting makes none for a
    while."""
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    """Where the commander logs the numbers of its progress, evaluation and learner rows, as
    scalars by env step (updates offline), beside metrics.jsonl: any of `tensorboard`
    (RUN_DIR/tb), `wandb` (offline in RUN_DIR/wandb unless WANDB_MODE is set; the wandb extra)
    and `mlflow` (a file store in RUN_DIR/mlruns unless MLFLOW_TRACKING_URI is set; the mlflow
    extra); [] logs to none. A logger that fails mid-run is named on stderr and dropped."""


@dataclass
class JobConfig:
    """A whole job: what to train, where, and when to stop."""

    name: str = "cartpole-dqn"
    """Job name, used in the run directory name."""
    seed: int = 0
    """Base seed; every role derives its own from it."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    """Agent to policy mapping."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Algorithm."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay."""
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    """Collection."""
    commander: CommanderConfig = field(default_factory=CommanderConfig)
    """Schedule and stop."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoints."""
    replay_log: ReplayLogConfig = field(default_factory=ReplayLogConfig)
    """Replay files for offline analysis."""
    offline: OfflineConfig = field(default_factory=OfflineConfig)
    """Offline training from a dataset."""
    psro: PSROConfig = field(default_factory=PSROConfig)
    """Populations trained by PSRO."""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """Role counts."""
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    """Process settings."""
