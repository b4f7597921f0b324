"""CellNetwork: users move between the cells of a small radio network; the agent decides
which cell serves each user; the reward is the throughput served.

A gymnasium environment of this project's own, in the spirit of mobile-network
coordination tasks. It travels with the playbook as the job's working_dir: no node
needs it installed.

- Cells sit at fixed places in the unit square; users take a random walk in it.
- Link quality of user u to cell c: exp(-d(u, c)^2 / (2 * RADIUS^2)), in (0, 1].
- Observation: every user's link quality to every cell (users x cells floats).
- Action: for each user, the index of the cell that serves it (MultiDiscrete).
- A cell shares its capacity equally among the users it serves, so a user's
  throughput is quality / load of its cell; the reward is its mean over users.
  Serving everyone from the nearest cell is good; balancing crowded cells is better.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from numpy.typing import NDArray

RADIUS = 0.3
STEP = 0.05


Action = NDArray[np.integer[Any]]


class CellNetwork(gym.Env[NDArray[np.float32], Action]):
    """Users x cells assignment with moving users; see the module docstring."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        config = config or {}
        self.n_cells = int(config.get("cells", 4))
        self.n_users = int(config.get("users", 4))
        self.horizon = int(config.get("horizon", 50))
        side = int(np.ceil(np.sqrt(self.n_cells)))
        grid = [((i % side + 0.5) / side, (i // side + 0.5) / side) for i in range(self.n_cells)]
        self.cells = np.array(grid, dtype=np.float64)
        self.observation_space = gym.spaces.Box(
            0.0, 1.0, (self.n_users * self.n_cells,), np.float32
        )
        self.action_space = gym.spaces.MultiDiscrete([self.n_cells] * self.n_users)
        self.users = np.zeros((self.n_users, 2))
        self.t = 0

    def quality(self) -> NDArray[np.float64]:
        """Link quality of every user (rows) to every cell (columns)."""
        d2 = ((self.users[:, None, :] - self.cells[None, :, :]) ** 2).sum(axis=-1)
        quality: NDArray[np.float64] = np.exp(-d2 / (2 * RADIUS**2))
        return quality

    def observe(self) -> NDArray[np.float32]:
        return self.quality().astype(np.float32).ravel()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[NDArray[np.float32], dict[str, Any]]:
        super().reset(seed=seed)
        self.users = self.np_random.uniform(0.0, 1.0, (self.n_users, 2))
        self.t = 0
        return self.observe(), {}

    def throughput(self, action: Action) -> NDArray[np.float64]:
        """Each user's served throughput under `action` (one cell index per user)."""
        serving = np.asarray(action, dtype=np.int64)
        load = np.bincount(serving, minlength=self.n_cells)
        quality = self.quality()[np.arange(self.n_users), serving]
        return quality / load[serving]

    def step(self, action: Action) -> tuple[NDArray[np.float32], float, bool, bool, dict[str, Any]]:
        reward = float(self.throughput(action).mean())
        moves = self.np_random.normal(0.0, STEP, self.users.shape)
        self.users = np.clip(self.users + moves, 0.0, 1.0)
        self.t += 1
        return self.observe(), reward, False, self.t >= self.horizon, {}


def nearest_cell(env: CellNetwork) -> NDArray[np.int64]:
    """The baseline policy: every user served by the cell it hears best."""
    return np.asarray(env.quality().argmax(axis=1), dtype=np.int64)
