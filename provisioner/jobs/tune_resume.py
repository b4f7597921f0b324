"""Run an unchanged Tune script so that its first `Tuner` continues an earlier experiment.

`submit --resume JOB` (and each attempt of `--retries`) of a script that trained through
Tune (RLlib's example runner included) cannot ask the script to call `Tuner.restore`: it
is the author's script, unchanged. The job's entrypoint runs the script through this file
instead (`python3 -c SOURCE SCRIPT ARGS`, only for such a resume): the earlier experiment's
folder, which `jobs.resume.seed` put under the job's results directory
(`$PROVISIONER_TUNE_RESUME`, relative to `$PROVISIONER_RESULTS_DIR`), is copied into the
job's own Tune storage (`$RAY_STORAGE`, the storage every node shares; else Tune's default
`~/ray_results`), and the first `Tuner(...)` the script makes is that experiment, restored with
Ray's own `Tuner.restore(path, trainable, param_space, resume_unfinished=True,
resume_errored=True)`: finished trials are kept as they are, unfinished and errored ones
go on from their latest checkpoints. This is the pattern Ray documents for a script run
again after a failure (`Tuner.can_restore`), applied from outside the script.

Then the script runs as `python3 SCRIPT ARGS` would run it (`runpy.run_path` as
`__main__`, its folder first on sys.path, `sys.argv` as given). A folder Tune cannot
restore (no experiment state in it) changes nothing: the script starts afresh, and says so.
It runs in the cluster's Python (Ray and pyarrow there), where provisioner is not installed:
standard library and Ray only.
"""

from __future__ import annotations

import copy
import os
import runpy
import sys
from typing import Any

RESUME_ENV = "PROVISIONER_TUNE_RESUME"
RESULTS_ENV = "PROVISIONER_RESULTS_DIR"
MARK = "provisioner:"


def _say(text: str) -> None:
    print(f"{MARK} {text}", flush=True)


def storage_root() -> str:
    """Where the script's Tune writes by default: $RAY_STORAGE, else ~/ray_results."""
    return os.environ.get("RAY_STORAGE") or os.path.expanduser("~/ray_results")


def joined(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


def place_experiment(folder: str, root: str) -> str:
    """Copy the experiment `folder` (local) into the storage `root`; its path there."""
    import pyarrow.fs as pafs  # type: ignore[import-untyped]

    name = os.path.basename(folder.rstrip("/"))
    fs, base = pafs.FileSystem.from_uri(root) if "://" in root else (pafs.LocalFileSystem(), root)
    dest = joined(base, name)
    fs.create_dir(dest, recursive=True)
    pafs.copy_files(
        folder, dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs
    )
    return joined(root, name)


def install(path: str) -> None:
    """Make the script's first `Tuner(...)` the experiment at `path`, restored (made in
    place of a fresh one, so that no empty experiment is started beside it)."""
    from ray import tune

    original = tune.Tuner.__init__
    used: list[bool] = []

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if used or kwargs.get("_tuner_internal") is not None:
            original(self, *args, **kwargs)
            return
        used.append(True)
        if not tune.Tuner.can_restore(path):
            _say(f"nothing Tune can restore at {path}: the experiment starts afresh")
            original(self, *args, **kwargs)
            return
        trainable: Any = args[0] if args else kwargs.get("trainable")
        restored = tune.Tuner.restore(
            path,
            trainable=trainable,
            param_space=kwargs.get("param_space"),
            resume_unfinished=True,
            resume_errored=True,
        )
        self.__dict__.update(restored.__dict__)
        _say(f"Tune's experiment restored from {path}")

    tune.Tuner.__init__ = init  # type: ignore[method-assign]
    forget_saves_in_flight()
    new_trials_in_the_new_place()


def forget_saves_in_flight() -> None:
    """Restore Tune's controller without the decisions it held for saves in flight.

    Ray 2.60's TuneController keeps a decision for each trial whose checkpoint is being
    saved (`_cached_trial_decisions`), to apply once the save resolves, and writes that
    dict into the experiment state. A trial whose node was lost during a save is left
    with a cached STOP; `Tuner.restore(resume_errored=True)` brings it back, and the
    restored trial stops after its first save, short of the run's stop (seen on the lab:
    8-trial sweep, a worker killed; one iteration after the restore, then TERMINATED).
    In a new session no save is in flight, so none of those decisions can apply: they
    are dropped as the controller's state is read. Tune's own in-run retry
    (`FailureConfig`) drops a failed trial's entry the same way (`_try_recover`)."""
    try:
        from ray.tune.execution.tune_controller import TuneController
    except ImportError:  # another Ray: nothing to mend
        return
    original = TuneController.__setstate__

    def setstate(self: Any, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and state.get("_cached_trial_decisions"):
            state = {**state, "_cached_trial_decisions": {}}
        original(self, state)  # type: ignore[no-untyped-call]

    TuneController.__setstate__ = setstate  # type: ignore[method-assign]


def new_trials_in_the_new_place() -> None:
    """Give a trial made after the restore the restored experiment's storage.

    `Tuner.restore` at another path (the next attempt's own storage) moves the trials it
    restores there (`TuneController._restore_trials`), but the search algorithm's state,
    restored with it, keeps the experiment's spec with the first storage: a trial it makes
    afterwards (a sweep's trial not started before the loss) wrote its checkpoints into the
    first attempt's folder, where they did not come home (seen on the lab: a 4-trial sweep
    whose head was lost; its last trial's result.json home, its checkpoints not). Each new
    trial is moved as Tune moves the restored ones: the experiment's filesystem, root and
    name."""
    try:
        from ray.tune.execution.tune_controller import TuneController
    except ImportError:  # another Ray: nothing to mend
        return
    original = TuneController.resume

    def resume(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = original(self, *args, **kwargs)
        search, storage = self._search_alg, self._storage
        made = search.next_trial

        def next_trial() -> Any:
            trial = made()
            if trial is not None and getattr(trial, "storage", None) is not None:
                moved = copy.copy(trial.storage)
                moved.storage_filesystem = storage.storage_filesystem
                moved.storage_fs_path = storage.storage_fs_path
                moved.experiment_dir_name = storage.experiment_dir_name
                trial.set_storage(moved)
            return trial

        search.next_trial = next_trial
        return done

    TuneController.resume = resume  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    script = argv[0]
    rel = os.environ.get(RESUME_ENV, "")
    if rel:
        folder = os.path.join(os.environ.get(RESULTS_ENV, "."), rel)
        if os.path.isdir(folder):
            path = place_experiment(folder, storage_root())
            install(path)
        else:
            _say(f"no experiment at {folder}: the script starts afresh")
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
