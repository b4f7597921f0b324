"""SSH to the nodes: sessions, a pool of them, bounded fan-out, results, command builders."""

from provisioner.remote.fanout import fan_out
from provisioner.remote.pool import Pool
from provisioner.remote.results import GroupResult, Result
from provisioner.remote.session import Session

__all__ = ["GroupResult", "Pool", "Result", "Session", "fan_out"]
