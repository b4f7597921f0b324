"""A job's results on the head: where they are, and bringing them home.

A job writes into its results directory on the head node's own disk (outside the Ray
container: `layout.node_results_dir(cluster)/JOB`). `pull` brings what is new there into
results/JOB here through `provisioner.remote.pull` (incremental by its manifest, each file
verified by size and sha256, bounded, no link followed on the head or here); this module
only says which folder that is and how the job's refusals read.
"""

from __future__ import annotations

from pathlib import Path

from provisioner.node import layout
from provisioner.remote import pull as directory
from provisioner.remote.session import Session


def enter_command(cluster: str, rel: str) -> str:
    """Shell: `cd` into the cluster's results root/rel on the head without following a link
    (exit 3: absent; exit 4: a link on the way)."""
    return directory.enter_command(layout.node_results_dir(cluster), rel)


def source(cluster: str, job_id: str, host: str) -> directory.Source:
    """The job's results directory on the head `host`, as a pull names it."""
    return directory.Source(
        root=layout.node_results_dir(cluster),
        rel=job_id,
        what=f"the results of job {job_id}",
        where=f"{host} (job {job_id})",
        again=f"provisioner jobs results {job_id}",
    )


def pull(session: Session, cluster: str, job_id: str, home: Path) -> directory.Pulled:
    """Bring what is new in the job's results on the head into `home` (results/JOB)."""
    return directory.pull(session, source(cluster, job_id, session.host), home)
