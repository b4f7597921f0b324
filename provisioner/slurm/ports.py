"""One block of Ray ports per SLURM job, a function of the job id alone.

Two jobs sharing a node (OverSubscribe, or one user's two allocations) must not meet on
any port, and every node of one job must agree on the ports without talking: so the
block is computed from the job id, here and in the rendered sbatch script (which does
the same arithmetic in bash from BLOCKS_START, BLOCK_SIZE and BLOCKS).
"""

from __future__ import annotations

from provisioner.inventory import RayPorts

BLOCKS_START = 20000  # below Linux's ephemeral range (32768-60999)
BLOCK_SIZE = 100
BLOCKS = 120  # 20000-31999
# Offsets in a block; the rest of the block is Ray's worker ports.
OFFSETS = {
    "gcs": 0,
    "dashboard": 1,
    "client": 2,
    "dashboard_agent_grpc": 3,
    "dashboard_agent_http": 4,
    "metrics_export": 5,
    "node_manager": 6,
    "object_manager": 7,
    "runtime_env_agent": 8,
    "min_worker": 10,
    "max_worker": BLOCK_SIZE - 1,
}


def port_base(job_id: int) -> int:
    """The first port of the job's block."""
    return BLOCKS_START + (job_id % BLOCKS) * BLOCK_SIZE


def bash_port_base(job_id_var: str = "SLURM_JOB_ID") -> str:
    """The same as `port_base`, as a bash arithmetic expression."""
    return f"$(( {BLOCKS_START} + (${job_id_var} % {BLOCKS}) * {BLOCK_SIZE} ))"


def job_ports(job_id: int) -> RayPorts:
    """Every Ray port of the job: its block."""
    base = port_base(job_id)
    return RayPorts(**{name: base + offset for name, offset in OFFSETS.items()})


def temp_dir(job_id: int) -> str:
    """The job's short Ray temp dir on every node: Ray's socket paths under it stay far
    below the 107-byte limit of a Unix socket path (a long $HOME would not)."""
    return f"/tmp/rayjob-{job_id}"
