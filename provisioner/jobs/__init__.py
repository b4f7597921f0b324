"""Training jobs on the cluster: submit a playbook, follow it, bring its results home.

- `spec`: the job as data (entrypoint, runtime_env with the playbook's directory);
- `client`: the Jobs API client carrying the token; `link`: the tunnel, client and SSH;
- `stream`: the live log, line by line, reconnecting when it drops;
- `submit`: the whole run; `control`: list, stop; `resume`: continue from a checkpoint;
- `place`: the seam for where a job runs (`Place`; the cluster's `Cluster`, the sbatch
  script's `Sbatch`);
- `head_folder`: which folder on the head holds a job's results, brought home by
  `provisioner.remote.pull` (incremental, verified, bounded);
- `home`, `plots`, `tables`: what comes home to results/JOB/ and the plots drawn here.
"""

from provisioner.jobs.spec import JobSpec, make_spec
from provisioner.jobs.submit import JobOutcome, submit

__all__ = ["JobOutcome", "JobSpec", "make_spec", "submit"]
