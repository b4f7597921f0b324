"""NVIDIA GPUs on the nodes: their facts as the doctor's round reads them (`facts`), and
which of them Ray gets and how a container receives them (`assignment`). Pure; imported by the
doctor, the command builders and the runtimes alike."""
