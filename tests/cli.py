"""Run the CLI in-process and capture stdout, stderr and the exit code."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any
from unittest import mock

from provisioner.cli import common, run


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def cli(*args: str) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    real_output = common.Output

    def make(json_mode: bool = False, **_: Any) -> Any:
        return real_output(json_mode=json_mode, stdout=out, stderr=err)

    with (
        mock.patch.object(common, "Output", make),
        mock.patch("sys.stdout", out),
        mock.patch("sys.stderr", err),
    ):
        code = run(list(args))
    return CliResult(code, out.getvalue(), err.getvalue())
