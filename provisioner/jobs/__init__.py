"""Training jobs on the cluster: submit a playbook, follow it, bring its results home.

- `spec`: the job as data (entrypoint, runtime_env with the playbook's directory);
- `client`: the Jobs API client carrying the token;
- `stream`: the live log, line by line;
- `submit`: the whole run, Ctrl-C included;
- `results`, `plots`, `tables`: what comes home to results/JOB/ and the plots drawn here;
- `provisioner_results`: the stdlib-only package that ships results through the job log.
"""

from provisioner.jobs.spec import JobSpec, make_spec
from provisioner.jobs.submit import JobOutcome, submit

__all__ = ["JobOutcome", "JobSpec", "make_spec", "submit"]
