"""The docker runtime: Ray in the pinned image's container, `docker run --net=host`.

`runtime.py` (start, stop, state, render; `RUNTIME`), `doctor.py` (its facts section's
parser and its judges; `JUDGES`) with `facts.sh` (that section of the facts script),
`delivery.py` (the image delivery: the push of the pin) with the push itself (`push.py`:
`direct.py` one node, `star.py` the star, `chain.py` and `chain_plan.py` the chain,
`push_plan.py` what each node lacks), `gpu.py` (how Docker hands GPUs over) and `lab.py`
(the lab's node recipe for it).
"""
