"""SLURM: the nodes of a cluster come from an allocation (sbatch, squeue, scancel)."""
