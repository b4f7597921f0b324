"""Pure decisions of `sagemaker run` and `sagemaker render`: which instance types are
which, the hyperparameters of a playbook's arguments, a job's name, its instance-hours and
cost."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.sagemaker.container import contract

LOCAL_TYPES = ("local", "local_gpu")
_ML_TYPE = re.compile(r"^ml\.[a-z0-9-]+\.[a-z0-9]+$")
MAX_INSTANCES = 100


def check_count(count: int) -> None:
    if not 1 <= count <= MAX_INSTANCES:
        raise InputError(
            f"--instance-count {count}: a job has 1 to {MAX_INSTANCES} instances",
            "give --instance-count N with N >= 1",
        )


def check_local(instance_type: str, count: int) -> None:
    """`run` runs local mode only: `local` or `local_gpu`."""
    check_count(count)
    if instance_type in LOCAL_TYPES:
        return
    if _ML_TYPE.fullmatch(instance_type):
        raise InputError(
            f"--instance-type {instance_type}: real SageMaker is not reachable from here "
            "(no AWS account or credentials are used)",
            f"`provisioner sagemaker render PLAYBOOK --instance-type {instance_type} "
            "--instance-count N -o DIR` writes what a real job needs; `--instance-type local` "
            "runs it here under the SDK's local mode",
        )
    raise InputError(
        f"--instance-type {instance_type!r} is not an instance type",
        "give `local`, `local_gpu`, or (for render) an ml.* type such as ml.c5.2xlarge",
    )


def check_real(instance_type: str, count: int) -> None:
    """`render` is for real instance types (ml.*)."""
    check_count(count)
    if not _ML_TYPE.fullmatch(instance_type):
        raise InputError(
            f"--instance-type {instance_type!r} is not a SageMaker instance type",
            "give an ml.* type such as ml.c5.2xlarge (`sagemaker run --instance-type local` "
            "runs here)",
        )


def hyperparameters(playbook: Path, args: Sequence[str]) -> dict[str, str]:
    """The playbook's name and options as SageMaker hyperparameters."""
    if not playbook.is_file() or playbook.suffix != ".py":
        raise InputError(
            f"playbook {playbook} is not a Python file",
            "give the path of a playbook, e.g. playbooks/ppo_cartpole.py",
        )
    try:
        return contract.hyperparameters_of(playbook.name, list(args))
    except contract.ContractError as e:
        raise InputError(str(e), "give the playbook's options as `-- --name value ...`") from None


def base_job_name(playbook: Path) -> str:
    """A training job name's stem: letters, digits and hyphens (SageMaker's rule)."""
    stem = re.sub(r"[^A-Za-z0-9]+", "-", playbook.stem).strip("-")[:30] or "job"
    return f"provisioner-{stem}"


def cost(
    instance_type: str, count: int, seconds: float, price_per_hour: float | None
) -> dict[str, Any]:
    """Instance-hours of a run, and its cost where a price per instance-hour is given
    (SageMaker bills each instance per second of the job's billable time)."""
    # the cost is the hours as written times the price, so the record checks by hand
    hours = round(count * seconds / 3600.0, 5)
    return {
        "instance_type": instance_type,
        "instance_count": count,
        "seconds": round(seconds, 1),
        "instance_hours": hours,
        "price_per_instance_hour": price_per_hour,
        "cost": None if price_per_hour is None else round(hours * price_per_hour, 5),
    }


def comparable_cost(sagemaker: dict[str, Any]) -> dict[str, Any]:
    """summary.json's `cost` of a SageMaker job, in the shape a cluster job's has
    (playbooks/rlrun.py `cost_of`: unit, hours, price_per_hour, cost), so that the two
    kinds of run compare field by field."""
    return {
        "unit": "instance-hour",
        "hours": sagemaker["instance_hours"],
        "price_per_hour": sagemaker["price_per_instance_hour"],
        "cost": sagemaker["cost"],
    }
