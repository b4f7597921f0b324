"""PPO on CellNetwork, this project's own environment (cell_network.py, in this directory).

    provisioner submit -i INVENTORY playbooks/ppo_cells.py -- --max-env-steps 50000

The environment's code travels with the job as its working_dir; no node installs it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import rlrun
from cell_network import CellNetwork

if TYPE_CHECKING:
    from ray.rllib.algorithms.ppo import PPOConfig


def config(args: argparse.Namespace) -> PPOConfig:
    env_config = {"cells": args.cells, "users": args.users, "horizon": args.horizon}
    return rlrun.ppo_config(args, CellNetwork, env_config)


if __name__ == "__main__":
    p = rlrun.parser(__doc__ or "", target_return=1e9, max_env_steps=50_000)
    p.add_argument("--cells", type=int, default=4)
    p.add_argument("--users", type=int, default=4)
    # Serving decisions do not change where users go next: credit a short horizon only.
    p.set_defaults(lr=1e-3, gamma=0.5)
    p.add_argument("--horizon", type=int, default=50)
    rlrun.run(p.parse_args(), config)
