"""The host runtime: Ray from each node's own Python, no container.

`runtime.py` (start, stop, state, render; `RUNTIME`, and `JUDGES` with its own-Ray
waiver), `doctor.py` (its judges: the Python Ray runs with, the same everywhere), `gpu.py`
(the GPUs as environment variables) and `lab.py` (the lab's node recipe for it). It has no
facts section of its own and no delivery: the nodes bring their own Ray.
"""
