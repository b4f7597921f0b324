"""SageMaker's training-container contract, read purely.

SageMaker (and the SDK's local mode) writes, before it runs `train`:

- `/opt/ml/input/config/hyperparameters.json`: a JSON object of strings;
- `/opt/ml/input/config/resourceconfig.json`: `current_host`, `hosts` (`algo-1`, ...),
  `current_instance_type`, `network_interface_name`;
- `/opt/ml/input/data/<channel>/`: one folder per input channel.

The `SM_*` variables (`SM_HOSTS`, `SM_CURRENT_HOST`, `SM_HPS`, `SM_MODEL_DIR`,
`SM_OUTPUT_DATA_DIR`, `SM_CHANNEL_<NAME>`) are what SageMaker's training toolkit derives
from those files; where they are set they win, so a script-mode launcher can steer this
entry point too.

The playbook and its arguments travel as hyperparameters: `provisioner_playbook` names the
file in the `code` channel, and every other key `k` with value `v` is the argument
`--k v` (an empty value: the flag `--k` alone), in the order given, which is how SageMaker's
own framework containers turn hyperparameters into a script's arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

CONFIG_DIR = PurePosixPath("/opt/ml/input/config")
DATA_DIR = PurePosixPath("/opt/ml/input/data")
MODEL_DIR = PurePosixPath("/opt/ml/model")
OUTPUT_DIR = PurePosixPath("/opt/ml/output")
CHECKPOINT_DIR = PurePosixPath("/opt/ml/checkpoints")  # CheckpointConfig.LocalPath's default
FAILURE_FILE = "failure"  # /opt/ml/output/failure: SageMaker's FailureReason (first 1 KiB)
FAILURE_BYTES = 1024

PLAYBOOK_KEY = "provisioner_playbook"
CODE_CHANNEL = "code"
# where checkpoints and the live results go, when not /opt/ml/checkpoints (local mode has
# no checkpoint sync, so `sagemaker run` points this at a channel it mounts)
CHECKPOINT_DIR_ENV = "PROVISIONER_SM_CHECKPOINT_DIR"
# the job's Ray token: a file `token` in the `auth` channel, made per job by `sagemaker run`;
# Ray reads it by path (RAY_AUTH_TOKEN_PATH), so it is never in a variable, an argument or
# a log, as on a cluster (provisioner/node/token.py)
AUTH_CHANNEL = "auth"
TOKEN_FILE = "token"
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")


class ContractError(ValueError):
    """The contract's files or variables are missing or malformed; the message says which."""


@dataclass(frozen=True)
class Resources:
    """This container's place in the job: its host name and every host's, in order."""

    current_host: str
    hosts: tuple[str, ...]
    instance_type: str

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def is_head(self) -> bool:
        return self.current_host == self.hosts[0]


@dataclass(frozen=True)
class Job:
    """What to run: the playbook (a file name in the code channel) and its arguments."""

    playbook: str
    args: tuple[str, ...]


def parse_resources(text: str | None, env: Mapping[str, str]) -> Resources:
    """resourceconfig.json's contents (None: no such file), with SM_HOSTS and
    SM_CURRENT_HOST winning where set."""
    data: dict[str, object] = {}
    if text is not None:
        loaded = _json(text, "resourceconfig.json")
        if not isinstance(loaded, dict):
            raise ContractError("resourceconfig.json is not a JSON object")
        data = loaded
    hosts = _json(env["SM_HOSTS"], "SM_HOSTS") if "SM_HOSTS" in env else data.get("hosts")
    current = env.get("SM_CURRENT_HOST", data.get("current_host"))
    if not isinstance(hosts, list) or not hosts:
        raise ContractError("resourceconfig.json has no `hosts` list (nor is SM_HOSTS set)")
    for h in hosts:
        if not isinstance(h, str) or not _HOST.fullmatch(h):
            raise ContractError(f"host {h!r} in `hosts` is not a host name")
    if len(set(hosts)) != len(hosts):
        raise ContractError(f"`hosts` names a host twice: {hosts}")
    if not isinstance(current, str) or current not in hosts:
        raise ContractError(f"`current_host` {current!r} is not one of `hosts` {hosts}")
    itype = env.get("SM_CURRENT_INSTANCE_TYPE", data.get("current_instance_type", ""))
    return Resources(current, tuple(hosts), str(itype or ""))


def parse_hyperparameters(text: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """hyperparameters.json's contents (None: no such file) or SM_HPS where set; values
    that are not strings (SM_HPS keeps JSON types) become their JSON text."""
    raw = env.get("SM_HPS", text)
    if raw is None:
        return {}
    data = _json(raw, "SM_HPS" if "SM_HPS" in env else "hyperparameters.json")
    if not isinstance(data, dict):
        raise ContractError("the hyperparameters are not a JSON object")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def job_of(hyperparameters: Mapping[str, str]) -> Job:
    """The playbook and its arguments, from the hyperparameters."""
    playbook = hyperparameters.get(PLAYBOOK_KEY, "")
    name = PurePosixPath(playbook)
    if not playbook or name.name != playbook or name.suffix != ".py":
        raise ContractError(
            f"hyperparameter {PLAYBOOK_KEY}={playbook!r} must name a .py file in the "
            f"`{CODE_CHANNEL}` channel"
        )
    args: list[str] = []
    for key, value in hyperparameters.items():
        if key == PLAYBOOK_KEY or key.startswith("sagemaker_"):  # the SDK's own keys
            continue
        if not _KEY.fullmatch(key):
            raise ContractError(f"hyperparameter {key!r} cannot be an option name")
        args.append(f"--{key}")
        if value != "":
            args.append(value)
    return Job(playbook, tuple(args))


def hyperparameters_of(playbook: str, args: Sequence[str]) -> dict[str, str]:
    """The inverse of `job_of`: the playbook's options as hyperparameters. Every argument
    must be an option (`--name value`, `--name=value` or a flag `--name`)."""
    out: dict[str, str] = {PLAYBOOK_KEY: playbook}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ContractError(
                f"playbook argument {arg!r} is not an option: SageMaker passes only "
                "`--name value` options (hyperparameters) to the playbook"
            )
        name, eq, value = arg[2:].partition("=")
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is not None and not (nxt.startswith("--") and len(nxt) > 2):
                value = nxt
                i += 1
        if not _KEY.fullmatch(name) or name == PLAYBOOK_KEY or name.startswith("sagemaker_"):
            raise ContractError(f"option {arg!r} cannot be a SageMaker hyperparameter name")
        if name in out:
            raise ContractError(f"option --{name} is given twice")
        if eq and value == "":
            raise ContractError(f"option {arg!r} has an empty value (a flag takes no `=`)")
        out[name] = value
        i += 1
    return out


def channel_dir(name: str, env: Mapping[str, str]) -> PurePosixPath:
    """Where an input channel's files are: SM_CHANNEL_<NAME> or /opt/ml/input/data/<name>."""
    return PurePosixPath(env.get(f"SM_CHANNEL_{name.upper()}", str(DATA_DIR / name)))


def model_dir(env: Mapping[str, str]) -> PurePosixPath:
    return PurePosixPath(env.get("SM_MODEL_DIR", str(MODEL_DIR)))


def output_dir(env: Mapping[str, str]) -> PurePosixPath:
    return PurePosixPath(env.get("SM_OUTPUT_DIR", str(OUTPUT_DIR)))


def checkpoint_dir(env: Mapping[str, str]) -> PurePosixPath:
    return PurePosixPath(env.get(CHECKPOINT_DIR_ENV, str(CHECKPOINT_DIR)))


def token_path(env: Mapping[str, str]) -> PurePosixPath:
    return channel_dir(AUTH_CHANNEL, env) / TOKEN_FILE


def ray_auth_env(token: PurePosixPath) -> dict[str, str]:
    """The variables that make every Ray process (`ray start`, a driver) use the job's
    token, read from the file `token`; the same as a cluster's nodes get."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def failure_text(reason: str) -> str:
    """What goes into /opt/ml/output/failure: the reason's end when it is long (the last
    lines of a traceback say most), within SageMaker's 1 KiB."""
    data = reason.strip().encode()
    if len(data) <= FAILURE_BYTES:
        return data.decode()
    return "..." + data[-(FAILURE_BYTES - 3) :].decode(errors="ignore")


def _json(text: str, what: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"{what} is not JSON: {e}") from None
