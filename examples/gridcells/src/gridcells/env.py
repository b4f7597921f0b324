"""The environment: a square of SIZE x SIZE, radio cells as discs (shapely geometry), one
user that moves a step at a time. Reward: the cells whose disc covers the user, minus a
small cost per step; the best place is where the most cells overlap."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from shapely.geometry import Point
from shapely.prepared import prep

SIZE = 10.0
STEP = 1.0
MOVES = np.array([(0.0, 0.0), (0.0, STEP), (0.0, -STEP), (-STEP, 0.0), (STEP, 0.0)])
CELLS = ((3.0, 3.0, 3.5), (7.0, 3.0, 3.5), (5.0, 7.0, 3.5))  # x, y, radius


class GridCellsEnv(gym.Env[np.ndarray, int]):
    """Observation: the user's position (scaled to 0..1) and, per cell, 1.0 when it covers
    the user. Actions: stay, up, down, left, right."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        config = {**(config or {}), **kwargs}  # RLlib passes env_config as keyword arguments
        self.horizon = int(config.get("horizon", 40))
        self.cells = [prep(Point(x, y).buffer(r)) for x, y, r in CELLS]
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 + len(self.cells),), np.float32)
        self.action_space = gym.spaces.Discrete(len(MOVES))
        self.pos = np.zeros(2)
        self.t = 0

    def _covered(self) -> np.ndarray:
        user = Point(*self.pos)
        return np.array([c.contains(user) for c in self.cells], dtype=np.float32)

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.pos / SIZE, self._covered()]).astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(0.0, SIZE, 2)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.pos = np.clip(self.pos + MOVES[int(action)], 0.0, SIZE)
        self.t += 1
        covered = self._covered()
        reward = float(covered.sum()) - 0.1
        return self._obs(), reward, False, self.t >= self.horizon, {"covered": int(covered.sum())}
