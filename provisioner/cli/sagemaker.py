"""`provisioner sagemaker run|render`: the playbook under SageMaker's training contract."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from provisioner.cli.common import JsonOption, output

app = typer.Typer(
    help="The playbook as a SageMaker training job: run (local mode here), render (a real job).",
    no_args_is_help=True,
)

PlaybookArgument = Annotated[Path, typer.Argument(help="The playbook, a Python file.")]
ArgsArgument = Annotated[
    list[str] | None, typer.Argument(help="The playbook's options, after `--`.")
]
TypeOption = Annotated[
    str,
    typer.Option("--instance-type", help="local / local_gpu (run), or an ml.* type (render)."),
]
CountOption = Annotated[int, typer.Option("--instance-count", help="Instances (hosts) of the job.")]
LockOption = Annotated[
    Path | None,
    typer.Option("--lock", help="The image pin (default: ./images/image.lock.json)."),
]


def _pin(lock: Path | None) -> Path:
    from provisioner.image.build import default_images_dir

    return lock or default_images_dir() / "image.lock.json"


def run_cmd(
    playbook: PlaybookArgument,
    args: ArgsArgument = None,
    instance_type: TypeOption = "local",
    instance_count: CountOption = 1,
    results: Annotated[
        Path, typer.Option("--results", help="Where results/JOB/ directories are made.")
    ] = Path("results"),
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="JOB|PATH",
            help="Start from the latest checkpoint of a job (cluster or SageMaker) or a PATH.",
        ),
    ] = None,
    price: Annotated[
        float | None,
        typer.Option("--price-per-hour", min=0.0, help="Price of one instance-hour, for cost."),
    ] = None,
    lock: LockOption = None,
    json_: JsonOption = False,
) -> None:
    """Run PLAYBOOK as a SageMaker training job under the SDK's local mode (Docker here):
    results, checkpoints and the model come home into RESULTS/JOB/."""
    from provisioner.local import state_root
    from provisioner.sagemaker.place import JobSpec, SageMakerLocal, require_ok

    out = output(json_)
    place = SageMakerLocal(
        instance_type=instance_type,
        instance_count=instance_count,
        results_root=results,
        state_dir=state_root(),
        pin_path=_pin(lock),
        price_per_hour=price,
        report=out.progress,
    )
    spec = JobSpec(playbook=playbook, args=tuple(args or ()))
    if resume is not None:
        spec = place.resume(spec, resume)
    result = place.run(spec)
    if json_:
        out.emit(result.to_json())
    else:
        s = result.summary or {}
        out.say(f"\nSageMaker job {result.job_id}: {result.status} in {result.seconds:.0f}s")
        if s:
            out.say(
                f"  {s.get('iterations')} iterations, {s.get('env_steps')} env steps, "
                f"return {s.get('episode_return_mean')}, stopped by {s.get('stopped_by')}; "
                f"checkpoint {s.get('checkpoint')}"
            )
            cost = place.cost(result)
            if cost is not None:
                out.say(f"  {cost.text()}")
        if result.failure:
            out.say(f"  failure: {result.failure}")
        out.say(f"  results in {result.directory}")
        if result.status == "stopped":
            out.say(f"  continue: provisioner sagemaker run --resume {result.directory} ...")
    require_ok(result)
    if result.status == "stopped":
        raise typer.Exit(1)


def render_cmd(
    playbook: PlaybookArgument,
    args: ArgsArgument = None,
    instance_type: TypeOption = "ml.c5.2xlarge",
    instance_count: CountOption = 1,
    out_dir: Annotated[Path, typer.Option("-o", "--output", help="The folder to write.")] = Path(
        "sagemaker-job"
    ),
    account: Annotated[str, typer.Option("--account", help="AWS account id.")] = "<ACCOUNT_ID>",
    region: Annotated[str, typer.Option("--region", help="AWS region.")] = "<REGION>",
    role: Annotated[str | None, typer.Option("--role", help="The execution role's ARN.")] = None,
    bucket: Annotated[
        str | None, typer.Option("--bucket", help="s3://BUCKET[/PREFIX] for code, checkpoints.")
    ] = None,
    lock: LockOption = None,
    json_: JsonOption = False,
) -> None:
    """Write what a real SageMaker job of PLAYBOOK needs (nothing is sent to AWS)."""
    from provisioner.local import path_error
    from provisioner.sagemaker.render import RenderOptions, render

    out = output(json_)
    options = RenderOptions(
        playbook=playbook,
        args=tuple(args or ()),
        instance_type=instance_type,
        instance_count=instance_count,
        out=out_dir,
        pin_path=_pin(lock),
        account=account,
        region=region,
        role=role,
        bucket=bucket,
    )
    try:
        done = render(options)
    except OSError as exc:  # the folder named (-o): missing parents are made; not writable
        left = "what it holds is not a whole job: render it again once fixed"
        raise path_error(
            exc, out_dir, "write the job's files here", after=left, folder=out_dir
        ) from None
    if json_:
        out.emit(done.to_json())
        return
    out.say(f"wrote {len(done.files)} file(s) into {done.directory}:")
    for name in done.files:
        out.say(f"  {name}")
    out.say(f"image: {done.image_uri}")
    out.say(f"checkpoints: {done.checkpoint_s3}")
    out.say("then: sh push.sh && python train_job.py (needs an AWS account; not run here)")


def register(root: typer.Typer) -> None:
    app.command("run")(run_cmd)
    app.command("render")(render_cmd)
    root.add_typer(app, name="sagemaker")
