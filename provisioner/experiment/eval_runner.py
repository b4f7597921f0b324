"""Runs with the CLUSTER's Python, as the driver of `provisioner eval`'s job; not imported
locally.

`provisioner eval -i INV JOB|PATH` sends a folder holding this file (as `RUNNER_NAME`) and
the checkpoint (`checkpoint/`), and runs

    python3 -u _provisioner_eval.py '{"checkpoint": "checkpoint", "episodes": 20, ...}'

It restores the algorithm with RLlib's own `Algorithm.from_checkpoint` (its env runners
on the cluster, as the training config asked for, their weights the checkpoint's), then:
- runs `episodes` episodes without exploration on those env runners (`EnvRunner.sample`
  with `num_episodes`, spread over them), each episode's return, length and node kept;
- records `video` more episodes as MP4 on the driver: a local env runner of the same
  config and state (connectors, weights) whose env renders `rgb_array`, each frame
  written by imageio-ffmpeg (headless: MuJoCo through OSMesa, pygame without a display).

Writes into $PROVISIONER_RESULTS_DIR (home under results/JOB/eval-*/): eval.json (the
figures), episodes.csv (one row per episode) and videos/*.mp4. Exit 1 when it cannot.
Ray, RLlib, gymnasium and the standard library only.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

MARK = "provisioner:"
RECORDED_ENV = "provisioner-recorded-env"
# Student's t, two-sided 95%, by degrees of freedom (1..30); beyond: the normal's 1.96
T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def say(text: str) -> None:
    print(f"{MARK} {text}", flush=True)


def figures(returns: list[float]) -> dict[str, Any]:
    """Mean, sample std and the 95% interval of the mean (Student's t) of `returns`."""
    n = len(returns)
    mean = sum(returns) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / (n - 1)) if n > 1 else 0.0
    t = T95[n - 2] if 2 <= n <= len(T95) + 1 else 1.96
    half = t * std / math.sqrt(n) if n > 1 else None
    return {
        "episodes": n,
        "mean": mean,
        "std": std,
        "min": min(returns),
        "max": max(returns),
        "ci95": [mean - half, mean + half] if half is not None else None,
        "ci95_half_width": half,
    }


def split(total: int, parts: int) -> list[int]:
    """`total` episodes over `parts` runners, as even as can be (the first get the rest)."""
    base, rest = divmod(total, parts)
    return [base + (1 if i < rest else 0) for i in range(parts)]


def trained_weights_everywhere(algo: Any) -> None:
    """Every remote env runner with the learner's weights, the trained ones, before an
    episode runs. Ray 2.60's `Algorithm.from_checkpoint` syncs them by weights sequence
    number, and an env runner given the checkpoint's env runner state first already holds
    that number: it keeps its initial weights (seen on the lab: of two env runners, one
    ran the trained policy, 296-500 on CartPole, the other returned 9 an episode, which
    one varying from run to run). Here the weights go without a sequence number, which
    RLlib's `set_state` takes as "update", and the call waits for every env runner."""
    import ray
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    group = algo.env_runner_group
    if not group.num_healthy_remote_env_runners():
        return
    state = algo.learner_group.get_state(
        components=[f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}"], inference_only=True
    )[COMPONENT_LEARNER]
    weights = ray.put({COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE]})
    group.foreach_env_runner(lambda r: r.set_state(ray.get(weights)), local_env_runner=False)


def episodes_on_runners(algo: Any, total: int) -> list[dict[str, Any]]:
    """`total` episodes without exploration on the algorithm's env runners (the remote
    ones, spread evenly; the local one when it has none)."""
    group = algo.env_runner_group
    remote = group.num_healthy_remote_env_runners()

    def run(count: int) -> Any:
        def on_runner(runner: Any) -> list[dict[str, Any]]:
            import ray

            node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
            done = runner.sample(num_episodes=count, explore=False) if count else []
            return [
                {"return": float(e.get_return()), "length": len(e), "node": node}
                for e in done[:count]
            ]

        return on_runner

    if remote:
        counts = [c for c in split(total, remote)]
        funcs = [run(c) for c in counts]
        found = group.foreach_env_runner(funcs, local_env_runner=False)
    else:
        found = group.foreach_env_runner(run(total), local_env_runner=True)
    return [e for part in found for e in part][:total]


def write_mp4(path: Path, frames: list[Any], fps: float) -> None:
    """`frames` (H x W x 3 uint8) as an H.264 MP4, one video frame per frame given
    (imageio-ffmpeg pipes them to its ffmpeg; moviepy's writer drops a last frame for some
    counts)."""
    import imageio_ffmpeg

    height, width = frames[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(
        str(path),
        (width, height),
        fps=fps,
        codec="libx264",
        pix_fmt_out="yuv420p",
        macro_block_size=2,
        ffmpeg_log_level="error",
    )
    import numpy as np

    writer.send(None)
    for frame in frames:
        writer.send(np.ascontiguousarray(frame))  # MuJoCo's frames are a flipped view
    writer.close()


def recorder_class() -> Any:
    import gymnasium as gym

    class Recorder(gym.Wrapper):  # type: ignore[type-arg]
        """Records the first `count` episodes of the env it wraps into `folder`, one MP4 per
        episode: the frame after reset, then one per step (rgb_array); beside each, a JSON
        of the episode's steps, return and frames as the env saw them."""

        def __init__(self, env: Any, folder: Path, count: int):
            super().__init__(env)
            self.folder, self.count = folder, count
            self.episode = -1
            self.frames: list[Any] = []
            self.steps, self.total = 0, 0.0

        def reset(self, **kwargs: Any) -> Any:
            self.finish()
            self.episode += 1
            found = self.env.reset(**kwargs)
            self.frames, self.steps, self.total = [], 0, 0.0
            if self.episode < self.count:
                self.frames.append(self.env.render())
            return found

        def step(self, action: Any) -> Any:
            obs, reward, terminated, truncated, info = self.env.step(action)
            self.steps += 1
            self.total += float(reward)
            if self.frames:
                self.frames.append(self.env.render())
                if terminated or truncated:
                    self.finish()
            return obs, reward, terminated, truncated, info

        def finish(self) -> None:
            if not self.frames:
                return
            name = f"eval-episode-{self.episode}.mp4"
            self.folder.mkdir(parents=True, exist_ok=True)
            fps = float(self.env.metadata.get("render_fps") or 30)
            write_mp4(self.folder / name, self.frames, fps)
            figures = {
                "file": f"videos/{name}",
                "return": self.total,
                "length": self.steps,
                "frames": len(self.frames),
                "fps": fps,
            }
            # beside the video: the env may live in another process than the driver's
            (self.folder / f"{name}.json").write_text(json.dumps(figures))
            self.frames = []

        def close(self) -> None:
            self.finish()  # an episode cut short is kept as far as it went
            super().close()  # type: ignore[no-untyped-call]

    return Recorder


def recorded_env_creator(env: Any, folder: Path, count: int) -> Any:
    """An env creator for RLlib: the training env rendering rgb_array, its first `count`
    episodes recorded into `folder` (`recorder_class`)."""

    def make(env_config: Any) -> Any:
        import gymnasium as gym
        from ray.tune.registry import ENV_CREATOR, _global_registry

        config = dict(env_config or {})
        registry: Any = _global_registry
        if isinstance(env, str) and registry.contains(ENV_CREATOR, env):
            created = registry.get(ENV_CREATOR, env)({**config, "render_mode": "rgb_array"})
        elif isinstance(env, str):
            created = gym.make(env, render_mode="rgb_array", **config)
        else:
            created = env({**config, "render_mode": "rgb_array"})
        if getattr(created, "render_mode", None) != "rgb_array":
            raise ValueError(f"the env {env!r} does not render rgb_array frames")
        return recorder_class()(created, folder, count)

    return make


def record_videos(algo: Any, count: int, folder: Path) -> list[dict[str, Any]]:
    """`count` episodes without exploration on a local env runner of the algorithm's config
    and state (connectors and weights), its env recorded; each video's episode figures."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
    from ray.tune.registry import register_env

    config = algo.config
    if config.is_multi_agent:
        raise ValueError("videos are recorded for single-agent envs only")
    register_env(RECORDED_ENV, recorded_env_creator(config.env, folder, count))
    local = config.copy(copy_frozen=False)
    local.environment(RECORDED_ENV, env_config=config.env_config)
    local.env_runners(num_env_runners=0, num_envs_per_env_runner=1)
    group = algo.env_runner_group
    if group.num_healthy_remote_env_runners():
        state = group.foreach_env_runner(lambda r: r.get_state(), local_env_runner=False)[0]
    else:
        state = group.local_env_runner.get_state()
    runner: Any = SingleAgentEnvRunner(config=local)
    try:
        runner.set_state(state)
        runner.sample(num_episodes=count, explore=False)
    finally:
        runner.stop()  # closes the env
    made = [json.loads(p.read_text()) for p in folder.glob("eval-episode-*.mp4.json")]
    for side in folder.glob("eval-episode-*.mp4.json"):
        side.unlink()  # said in eval.json
    return sorted(made, key=lambda v: int(str(v["file"]).rsplit("-", 1)[1].split(".")[0]))[:count]


def main(argv: list[str]) -> int:
    import ray
    from ray.rllib.algorithms.algorithm import Algorithm

    spec = json.loads(argv[0])
    results = Path(os.environ.get("PROVISIONER_RESULTS_DIR", "results"))
    results.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(spec["checkpoint"]).resolve()
    ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    started = time.time()
    say(f"restoring {spec.get('source') or checkpoint.name} with Algorithm.from_checkpoint")
    algo: Any = Algorithm.from_checkpoint(str(checkpoint))
    try:
        trained_weights_everywhere(algo)
        env = algo.config.env
        runners = algo.env_runner_group.num_healthy_remote_env_runners()
        say(
            f"{spec['episodes']} episode(s) of {env} without exploration on "
            f"{runners or 'the local'} env runner(s)"
        )
        episodes = episodes_on_runners(algo, int(spec["episodes"]))
        if not episodes:
            print(f"{MARK} no episode ended", file=sys.stderr, flush=True)
            return 1
        stats = figures([e["return"] for e in episodes])
        ci = stats["ci95"]
        interval = f"; 95% interval of the mean [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        say(
            f"return {stats['mean']:.2f} ± {stats['std']:.2f} (std) over "
            f"{stats['episodes']} episode(s){interval}"
        )
        videos: list[dict[str, Any]] = []
        video_error = None
        if int(spec.get("video") or 0) > 0:
            try:
                videos = record_videos(algo, int(spec["video"]), results / "videos")
                say(f"{len(videos)} video(s) recorded: {[v['file'] for v in videos]}")
            except Exception as exc:  # the returns stand; the video's failure is said
                video_error = f"{type(exc).__name__}: {exc}"
                print(f"{MARK} no video: {video_error}", file=sys.stderr, flush=True)
        # the training return at the iteration the checkpoint was taken (the restored
        # algorithm's), from the run's own records; else what the files here said
        iteration = int(getattr(algo, "iteration", 0) or 0)
        training = (spec.get("returns_by_iteration") or {}).get(str(iteration))
        if training is None:
            training = spec.get("training_return")
        document = {
            "source": spec.get("source"),
            "checkpoint": spec.get("source_checkpoint"),
            "env": str(env),
            "algorithm": type(algo).__name__,
            "explore": False,
            "training_iteration": iteration,
            "training_return": training,
            "ratio_to_training": (
                stats["mean"] / training if isinstance(training, int | float) and training else None
            ),
            **stats,
            "nodes": sorted({e["node"] for e in episodes}),
            "videos": videos,
            "video_error": video_error,
            "time_s": round(time.time() - started, 2),
        }
        (results / "eval.json").write_text(json.dumps(document, indent=1) + "\n")
        with (results / "episodes.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["episode", "return", "length", "node"])
            for i, e in enumerate(episodes):
                writer.writerow([i, e["return"], e["length"], e["node"]])
        return 1 if video_error else 0
    finally:
        algo.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
