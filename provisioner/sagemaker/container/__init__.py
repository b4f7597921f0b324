"""What runs inside the SageMaker training image: `train` (the entry point SageMaker runs
as `docker run IMAGE train`) and the pure reading of the contract's files.

Standard library only, with relative imports among these modules: the image copies this
folder as a package of its own, without the rest of provisioner.
"""
