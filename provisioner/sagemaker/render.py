"""`sagemaker render`: the files a real SageMaker training job of a playbook needs, written
without calling AWS.

- `push.sh`: the training image (the pin's SageMaker variant, its tag its pin) to ECR, and
  the playbook's directory (`code/`, written beside it) to S3;
- `train_job.py`: the job as a `ModelTrainer` (`Mode.SAGEMAKER_TRAINING_JOB`);
- `create-training-job.json`: the equivalent `CreateTrainingJob` request, as the SDK itself
  builds it (ModelTrainer's own request builder, in boto3's shape);
- `hyperparameters.json`: the playbook and its arguments, as the container reads them.

Account, region, role and bucket are placeholders unless given; they are what a real run
needs beyond this machine (an AWS account, an execution role SageMaker can assume with
access to the bucket and the ECR repository, and instance quota for the type).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.image.pin import read_pin
from provisioner.sagemaker import plan
from provisioner.sagemaker.container import contract
from provisioner.sagemaker.image import context_files, tag_for

ACCOUNT = "<ACCOUNT_ID>"
REGION = "<REGION>"
MAX_RUN_S = 24 * 3600


@dataclass(frozen=True)
class RenderOptions:
    playbook: Path
    args: tuple[str, ...]
    instance_type: str
    instance_count: int
    out: Path
    pin_path: Path
    account: str = ACCOUNT
    region: str = REGION
    role: str | None = None
    bucket: str | None = None
    max_run_s: int = MAX_RUN_S


@dataclass(frozen=True)
class Rendered:
    directory: Path
    files: list[str]
    image_tag: str
    image_uri: str
    checkpoint_s3: str
    request: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "files": self.files,
            "image_tag": self.image_tag,
            "image_uri": self.image_uri,
            "checkpoint_s3": self.checkpoint_s3,
        }


def image_uri(account: str, region: str, tag: str) -> str:
    return f"{account}.dkr.ecr.{region}.amazonaws.com/{tag}"


def push_script(tag: str, account: str, region: str, code_s3: str, auth_s3: str = "") -> str:
    """Shell commands: the image to ECR, the code to S3, and a new Ray token for the job
    (the `auth` channel's `token`: made from /dev/urandom and piped to S3, never on disk
    here, on a command line or printed) (pure)."""
    repo, _, version = tag.partition(":")
    registry = f"{account}.dkr.ecr.{region}.amazonaws.com"
    return f"""#!/bin/sh
# Rendered by `provisioner sagemaker render`. Needs the AWS CLI v2 with credentials for
# account {account}, and Docker holding {tag} (`provisioner sagemaker run` or
# `sagemaker render` on a machine with Docker builds it from the pin).
set -eu
cd "$(dirname "$0")"
docker image inspect {tag} >/dev/null
aws ecr describe-repositories --region {region} --repository-names {repo} >/dev/null 2>&1 \\
  || aws ecr create-repository --region {region} --repository-name {repo}
aws ecr get-login-password --region {region} \\
  | docker login --username AWS --password-stdin {registry}
docker tag {tag} {registry}/{repo}:{version}
docker push {registry}/{repo}:{version}
aws s3 sync --delete code/ {code_s3}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' \\
  | aws s3 cp --only-show-errors - {auth_s3}token
"""


def trainer_script(settings: dict[str, Any]) -> str:
    """A ModelTrainer script for the real job (pure; every value a Python literal)."""
    s = {k: repr(v) for k, v in settings.items()}
    return f'''"""Rendered by `provisioner sagemaker render`: a SageMaker training job.

Run `sh push.sh` first (the image to ECR, the code to S3), then `python train_job.py`
with AWS credentials. Checkpoints sync to {settings["checkpoint_s3"]}: a job started again
with the same location continues from the latest one.
"""

from sagemaker.train import ModelTrainer
from sagemaker.core.training.configs import (
    CheckpointConfig,
    Compute,
    InputData,
    OutputDataConfig,
    StoppingCondition,
)

trainer = ModelTrainer(
    training_image={s["image"]},
    role={s["role"]},
    base_job_name={s["base_job_name"]},
    compute=Compute(instance_type={s["instance_type"]}, instance_count={s["instance_count"]}),
    hyperparameters={s["hyperparameters"]},
    checkpoint_config=CheckpointConfig(
        s3_uri={s["checkpoint_s3"]}, local_path="/opt/ml/checkpoints"
    ),
    output_data_config=OutputDataConfig(s3_output_path={s["output_s3"]}),
    stopping_condition=StoppingCondition(max_runtime_in_seconds={s["max_run_s"]}),
)
trainer.train(
    input_data_config=[
        InputData(channel_name="code", data_source={s["code_s3"]}),
        InputData(channel_name="auth", data_source={s["auth_s3"]}),
    ]
)
'''


def request_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The CreateTrainingJob request, as the SDK's ModelTrainer builds it (boto3 shape)."""
    from provisioner.sagemaker.local import check_sdk, sdk_environment

    check_sdk()
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        InputData,
        OutputDataConfig,
        StoppingCondition,
    )
    from sagemaker.train import ModelTrainer
    from sagemaker.train.model_trainer import Mode

    with tempfile.TemporaryDirectory() as tmp, sdk_environment(Path(tmp)):
        # built in local mode so that the SDK makes no AWS session; the request has no mode
        trainer = ModelTrainer(
            training_image=settings["image"],
            training_mode=Mode.LOCAL_CONTAINER,
            role=settings["role"],
            base_job_name=settings["base_job_name"],
            compute=Compute(
                instance_type=settings["instance_type"],
                instance_count=settings["instance_count"],
            ),
            hyperparameters=settings["hyperparameters"],
            checkpoint_config=CheckpointConfig(
                s3_uri=settings["checkpoint_s3"], local_path="/opt/ml/checkpoints"
            ),
            output_data_config=OutputDataConfig(s3_output_path=settings["output_s3"]),
            stopping_condition=StoppingCondition(max_runtime_in_seconds=settings["max_run_s"]),
        )
        request = trainer._create_training_job_args(
            input_data_config=[
                InputData(channel_name="code", data_source=settings["code_s3"]),
                InputData(channel_name=contract.AUTH_CHANNEL, data_source=settings["auth_s3"]),
            ],
            boto3=True,
        )
    return dict(request)


def render(opts: RenderOptions) -> Rendered:
    plan.check_real(opts.instance_type, opts.instance_count)
    hyper = plan.hyperparameters(opts.playbook, opts.args)
    pin = read_pin(opts.pin_path)
    tag = tag_for(pin.image_id, context_files(pin.tag, pin.image_id))
    bucket = opts.bucket or f"s3://sagemaker-{opts.region}-{opts.account}"
    if not bucket.startswith("s3://"):
        raise InputError(f"--bucket {bucket}: not an s3:// URI", "give --bucket s3://NAME/PREFIX")
    base = plan.base_job_name(opts.playbook)
    prefix = f"{bucket.rstrip('/')}/provisioner/{base}"
    settings: dict[str, Any] = {
        "image": image_uri(opts.account, opts.region, tag),
        "role": opts.role or f"arn:aws:iam::{opts.account}:role/SageMakerExecutionRole",
        "base_job_name": base,
        "instance_type": opts.instance_type,
        "instance_count": opts.instance_count,
        "hyperparameters": hyper,
        "checkpoint_s3": f"{prefix}/checkpoints/",
        "output_s3": f"{prefix}/output/",
        "code_s3": f"{prefix}/code/",
        "auth_s3": f"{prefix}/auth/",
        "max_run_s": opts.max_run_s,
    }
    request = request_of(settings)
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    code = out / "code"
    shutil.rmtree(code, ignore_errors=True)
    code.mkdir()
    from provisioner.sagemaker.local import stage_code

    stage_code(opts.playbook.resolve(), code)
    (out / "push.sh").write_text(
        push_script(tag, opts.account, opts.region, settings["code_s3"], settings["auth_s3"])
    )
    (out / "push.sh").chmod(0o755)
    (out / "train_job.py").write_text(trainer_script(settings))
    (out / "create-training-job.json").write_text(json.dumps(request, indent=2) + "\n")
    (out / "hyperparameters.json").write_text(json.dumps(hyper, indent=2) + "\n")
    files = ["push.sh", "train_job.py", "create-training-job.json", "hyperparameters.json"]
    files += sorted(f"code/{p.relative_to(code)}" for p in code.rglob("*") if p.is_file())
    return Rendered(out, files, tag, settings["image"], settings["checkpoint_s3"], request)
