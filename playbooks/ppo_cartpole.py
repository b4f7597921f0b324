"""PPO on CartPole-v1, env runners spread over every node of the cluster.

    provisioner submit -i INVENTORY playbooks/ppo_cartpole.py -- --target-return 450

Stops at the target return or the step budget; results land in $PROVISIONER_RESULTS_DIR.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import rlrun

if TYPE_CHECKING:
    from ray.rllib.algorithms.ppo import PPOConfig


def config(args: argparse.Namespace) -> PPOConfig:
    return rlrun.ppo_config(args, "CartPole-v1")


if __name__ == "__main__":
    options = rlrun.parser(__doc__ or "", target_return=450.0, max_env_steps=200_000).parse_args()
    rlrun.run(options, config)
