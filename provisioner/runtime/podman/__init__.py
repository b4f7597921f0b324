"""The podman runtime: docker mode's container (`runtime.containers`) run by the SSH
user's rootless Podman.

`runtime.py` (`RUNTIME`), `doctor.py` (its facts section and judges; `JUDGES`),
`delivery.py` (`podman load` of the saved image), `gpu.py` (CDI) and `lab.py` (the lab's
node recipe for it).
"""
