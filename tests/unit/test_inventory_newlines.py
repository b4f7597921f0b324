"""Every name checked by a pattern is checked whole: `re.match` with a pattern ending in `$`
accepts a trailing newline ("name\\n"), so each check uses `fullmatch`. One case per check:
the name with a newline refused, the same name without it accepted (positive control)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.gpu.assignment import GpuPlan, accelerator_label_env
from provisioner.gpu.facts import GpuFacts
from provisioner.image.pin import pin_from_dict, pin_to_dict
from provisioner.inventory import fields
from provisioner.inventory.allocation import node_name_problem
from provisioner.inventory.models import time_seconds
from provisioner.jobs.spec import check_job_id
from provisioner.lab.config import LabConfig, validate
from provisioner.sagemaker.container.contract import ContractError, job_of, parse_resources
from provisioner.sagemaker.plan import check_real
from tests.unit.test_image_lock import make_pin

W = fields.Where(Path("inv.yaml"), 3)


def refused(check: Callable[[], object], error: type[Exception] = InputError) -> bool:
    try:
        check()
    except error:
        return True
    return False


def pin_with(key: str, value: str) -> object:
    data = pin_to_dict(make_pin())
    data[key] = value
    return pin_from_dict(data, "image.lock.json")


def job_id_taken(value: str) -> object:
    return check_job_id(value)


def resources(host: str) -> object:
    return parse_resources(None, {"SM_HOSTS": f'["{host}"]'.replace("\n", "\\n"),
                                  "SM_CURRENT_HOST": host})  # fmt: skip


CHECKS: dict[str, tuple[str, Callable[[str], object], type[Exception]]] = {
    "node name": ("gpu-01", lambda v: fields.check_name(v, W, "head.name"), InputError),
    "address (DNS name)": ("gpu-01", lambda v: fields.check_address(v, W, "a"), InputError),
    "user": ("ubuntu", lambda v: fields.check_user(v, W, "ssh.user"), InputError),
    "cluster": ("rack-1", lambda v: fields.check_cluster(v, W, "cluster"), InputError),
    "runtime": ("docker", lambda v: fields.check_runtime(v, W, "runtime"), InputError),
    "python": ("/opt/venv/bin/python", lambda v: fields.check_python(v, W, "py"), InputError),
    "label key": ("zone", lambda v: fields.check_label_map({v: "a"}, W, "labels"), InputError),
    "label value": ("a", lambda v: fields.check_label_map({"zone": v}, W, "labels"), InputError),
    "gpu id": ("0", lambda v: fields.check_gpus([v], {}, W, "gpus"), InputError),
    "SLURM node name": (
        "n-1",
        lambda v: (_ for _ in ()).throw(InputError(p)) if (p := node_name_problem(v)) else v,
        InputError,
    ),
    "SLURM time": ("1:00:00", time_seconds, ValueError),
    "pin image_id": ("sha256:" + "a" * 64, lambda v: pin_with("image_id", v), InputError),
    "pin base_image_id": ("sha256:" + "b" * 64, lambda v: pin_with("base_image_id", v), InputError),
    "job id": ("ppo-1", job_id_taken, InputError),
    "SageMaker instance type": ("ml.m5.xlarge", lambda v: check_real(v, 1), InputError),
    "SageMaker host": ("algo-1", resources, ContractError),
    "SageMaker hyperparameter": (
        "lr",
        lambda v: job_of({"provisioner_playbook": "p.py", v: "1"}),
        ContractError,
    ),
    "lab name": ("lab", lambda v: validate(LabConfig(name=v)), InputError),
}


@pytest.mark.parametrize("what", list(CHECKS))
def test_a_trailing_newline_is_refused(what: str) -> None:
    good, check, error = CHECKS[what]
    assert not refused(lambda: check(good), error), f"{what}: {good!r} refused"  # control
    assert refused(lambda: check(good + "\n"), error), f"{what}: {good + chr(10)!r} taken"


def test_derived_names_take_no_trailing_newline() -> None:
    """Names that are only used when they match: a GPU device file, an accelerator label."""
    assert GpuFacts(devices=("/dev/nvidia0", "/dev/nvidia1\n")).gpu_files == ("/dev/nvidia0",)
    assert accelerator_label_env(GpuPlan("gpus", ("GPU-1",), (0,), "A100"))
    assert accelerator_label_env(GpuPlan("gpus", ("GPU-1",), (0,), "A100\n")) == {}
