"""The playbook under SageMaker's training contract: `sagemaker run` (the SDK's local mode
on this machine's Docker) and `sagemaker render` (what a real job needs).

`container/` is what runs inside the training image (standard library only); the rest runs
on the control machine and imports the SageMaker SDK (the `[sagemaker]` extra) lazily.
"""
