"""The host runtime: Ray from each node's own Python, no container.

`runtime.py` (`RUNTIME`), `doctor.py` (its facts section and judges; `JUDGES`), `gpu.py`
(the GPUs as environment variables) and `lab.py` (the lab's node recipe for it).
"""
