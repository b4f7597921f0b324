"""GridCells: a user walks among radio cells; the reward is how many cells cover it.

`import gridcells` registers the environment with gymnasium as `gridcells/GridCells-v0`.
"""

from gymnasium.envs.registration import register

from gridcells.env import GridCellsEnv

__all__ = ["GridCellsEnv"]

register(id="gridcells/GridCells-v0", entry_point="gridcells.env:GridCellsEnv")
