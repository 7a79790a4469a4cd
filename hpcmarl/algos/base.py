"""What network algorithms share: named networks, one Adam optimizer over the trained ones,
flat gradients, the clip, and state that resumes bit for bit.

A subclass builds its networks in `build_networks` (trained: one optimizer steps them all) and
`build_extra_networks` (kept in step by the algorithm itself, like DQN's target network), says
which network acts for each policy (`acting`), and supplies the loss. Algorithms whose update is
one gradient per batch (DQN, BC) implement `compute_gradients`; the base turns that into the
contract's one-yield `update`. Others (PPO) override `update`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hpcmarl.algos.contract import Algorithm, Batch, GroupSpec, UpdateResult, UpdateSteps
from hpcmarl.algos.networks import FlatGrads, get_flat, num_params, set_flat


class NetworkAlgorithm(Algorithm):
    """A group's networks, its optimizer and its counters."""

    def __init__(self, group: GroupSpec, job: Any, seed: int, device: str = "cpu") -> None:
        self.group = group
        self.job = job
        self.cfg = job.learner
        self.device = torch.device(device)
        with torch.random.fork_rng(devices=[]):  # seed the init without touching global RNG
            torch.manual_seed(seed)
            self.networks = {k: n.to(self.device) for k, n in self.build_networks().items()}
            self.extras = {k: n.to(self.device) for k, n in self.build_extra_networks().items()}
        self.trained_names = [
            f"{net}.{name}"
            for net, module in self.networks.items()
            for name, _ in module.named_parameters()
        ]
        self.params = [p for module in self.networks.values() for p in module.parameters()]
        self.grads = FlatGrads(self.params)
        # torch's fused kernel: one call per step instead of a dozen small ops per tensor (a
        # third of a small network's update on one CPU thread); the gradients are float32.
        self.optimizer = torch.optim.Adam(self.params, lr=self.cfg.lr, fused=True)
        self.updates = 0
        """Updates completed (batches trained on)."""
        self.steps = 0
        """Optimizer steps taken."""
        self.grad_norm = 0.0
        """Global gradient norm before clipping, of the last `apply_gradients`."""

    # -- what subclasses define -------------------------------------------------------------
    def build_networks(self) -> dict[str, torch.nn.Module]:
        """The trained networks by name (their order is the order of the flat gradient)."""
        raise NotImplementedError

    def build_extra_networks(self) -> dict[str, torch.nn.Module]:
        """Networks not stepped by the optimizer that a checkpoint and a group must hold."""
        return {}

    def acting(self, policy: str) -> torch.nn.Module:
        """The network that acts for `policy` (what is published under its key)."""
        raise NotImplementedError

    def compute_gradients(
        self, batch: Batch, weights: np.ndarray | None
    ) -> tuple[np.ndarray, dict[str, float], np.ndarray]:
        """One-gradient algorithms: the flat loss gradient on `batch` (the gradients' own
        buffer, valid until the next backward), stats, and a per-item error that prioritized
        replay turns into priorities."""
        raise NotImplementedError

    def after_step(self) -> None:
        """Called after every optimizer step (Q-learners move their targets here)."""

    def extra_state(self) -> dict[str, np.ndarray]:
        """Further arrays an exact resume needs (running statistics, RNG states)."""
        return {}

    def load_extra_state(self, state: dict[str, np.ndarray]) -> None: ...

    # -- the contract -----------------------------------------------------------------------
    def update(self, batch: Batch, weights: np.ndarray | None = None) -> UpdateSteps:
        """One gradient, averaged over the group, one optimizer step."""
        flat_grad, stats, errors = self.compute_gradients(batch, weights)
        average = yield flat_grad
        self.apply_gradients(average)
        self.updates += 1
        stats["grad_norm"] = self.grad_norm
        return UpdateResult(stats, np.abs(errors).astype(np.float32))

    def publish(self) -> dict[str, np.ndarray]:
        return {self.group.keys[p]: get_flat(self.acting(p)) for p in self.group.policies}

    def group_weights(self) -> np.ndarray:
        nets = [*self.networks.values(), *self.extras.values()]
        return np.concatenate([get_flat(net) for net in nets])

    def load_group_weights(self, flat: np.ndarray) -> None:
        offset = 0
        for net in [*self.networks.values(), *self.extras.values()]:
            n = num_params(net)
            set_flat(net, flat[offset : offset + n])
            offset += n

    # -- shared machinery -------------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> np.ndarray:
        """Gradients of `loss` on the trained networks as one flat vector: the buffer they
        accumulate in, so it holds them only until the next backward."""
        self.grads.zero()
        loss.backward()
        return self.grads.vector()

    def apply_gradients(self, flat_grad: np.ndarray) -> None:
        """Clip, take one Adam step, count it."""
        self.grads.load(flat_grad)
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        self.grad_norm = self.grads.clip(max_norm)
        self.optimizer.step()
        self.steps += 1
        self.after_step()

    def follow_targets(
        self, pairs: list[tuple[torch.nn.Module, torch.nn.Module]], every: int, tau: float
    ) -> None:
        """Target networks follow their online ones, (online, target) in `pairs`: with `tau`
        > 0 a little after every update (Polyak averaging, target <- tau online + (1 - tau)
        target), which moves the bootstrap targets smoothly instead of in jumps; else a hard
        copy every `every` updates."""
        if tau > 0:
            with torch.no_grad():
                for online, target in pairs:
                    for held, new in zip(target.parameters(), online.parameters(), strict=True):
                        held.lerp_(new, tau)
        elif self.steps % every == 0:
            for online, target in pairs:
                target.load_state_dict(online.state_dict())

    def state_dict(self) -> dict[str, np.ndarray]:
        state: dict[str, np.ndarray] = {}
        for name, net in [*self.networks.items(), *self.extras.items()]:
            state |= {f"{name}/{k}": _np(v) for k, v in net.state_dict().items()}
        for index, slots in self.optimizer.state_dict()["state"].items():
            state |= {f"optim/{self.trained_names[index]}/{k}": _np(v) for k, v in slots.items()}
        state["updates"] = np.array(self.updates, dtype=np.int64)
        state["steps"] = np.array(self.steps, dtype=np.int64)
        return state | {f"extra/{k}": v for k, v in self.extra_state().items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of `state_dict`: after it, updates continue bit for bit."""
        for name, net in [*self.networks.items(), *self.extras.items()]:
            net.load_state_dict(_section(state, f"{name}/", self.device))
        optim_state = self.optimizer.state_dict()
        optim_state["state"] = {
            i: slots
            for i, name in enumerate(self.trained_names)
            if (slots := _section(state, f"optim/{name}/"))
        }
        self.optimizer.load_state_dict(optim_state)
        self.updates, self.steps = int(state["updates"]), int(state["steps"])
        extra = {k[len("extra/") :]: v for k, v in state.items() if k.startswith("extra/")}
        self.load_extra_state(extra)

    def tensor(self, batch: Batch, key: str, dtype: torch.dtype) -> torch.Tensor:
        return on_device(batch[key], self.device, dtype)


def on_device(
    array: np.ndarray, device: torch.device | None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`array` as a tensor of `dtype` on `device`, moved in the dtype it is stored in and cast
    there: uint8 observations (image spaces, `GroupSpec.obs_dtype`) cross to an accelerator at a
    quarter of float32's bytes. `dtype` None keeps the stored dtype, except that uint8 becomes
    float32 (what every network reads; the `cnn` torso then scales it to [0, 1])."""
    tensor = torch.as_tensor(np.asarray(array), device=device)
    if dtype is None:
        dtype = torch.float32 if tensor.dtype == torch.uint8 else tensor.dtype
    return tensor.to(dtype)


def _np(value: torch.Tensor | float | int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.asarray(value)


def _section(
    state: dict[str, np.ndarray], prefix: str, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Entries under `prefix`, prefix stripped, as tensors."""
    return {
        k[len(prefix) :]: torch.as_tensor(np.array(v), device=device)
        for k, v in state.items()
        if k.startswith(prefix)
    }
