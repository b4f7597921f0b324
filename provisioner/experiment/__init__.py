"""Experiments as files (issue 45): an RLlib tuned-example YAML read with its lines,
validated against the image's facts and the cluster, and the algorithm config it resolves to.

Pure: nothing here imports RLlib, gymnasium or the CLI; the facts come from
`capture_facts.py`, run with the image's Python.
"""

from provisioner.experiment.facts import Facts, load_facts
from provisioner.experiment.file import Experiment, load_experiment, parse_experiment
from provisioner.experiment.resolve import bundles, resolved_config
from provisioner.experiment.validate import (
    ClusterCapacity,
    NodeCapacity,
    Problem,
    check,
    raise_problems,
    validate,
)

__all__ = [
    "ClusterCapacity",
    "Experiment",
    "Facts",
    "NodeCapacity",
    "Problem",
    "bundles",
    "check",
    "load_experiment",
    "load_facts",
    "parse_experiment",
    "raise_problems",
    "resolved_config",
    "validate",
]
