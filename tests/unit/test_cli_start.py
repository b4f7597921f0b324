"""What a command's start imports: paramiko's optional invoke stays out of the CLI process,
and paramiko still reads ssh_config without it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import provisioner.cli
from provisioner.cli import app_for
app_for(["up"])
import paramiko
config = paramiko.SSHConfig.from_text("Host n1\\n  HostName 10.0.0.5\\n  Port 2222\\n")
found = config.lookup("n1")
print(sys.modules.get("invoke", "absent"), "unittest.mock" in sys.modules)
print(found["hostname"], found["port"])
"""


def test_the_cli_keeps_invoke_out_and_paramiko_reads_ssh_config_without_it() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["None", "False", "10.0.0.5", "2222"], out


def test_positive_control_paramiko_alone_imports_invoke() -> None:
    """Without the CLI, importing paramiko brings invoke in: the CLI's entry is what stops it."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, paramiko; print('invoke' in sys.modules and "
         "sys.modules['invoke'] is not None)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert out == "True"


def test_up_leaves_the_jobs_api_client_out_and_submit_brings_it() -> None:
    """`up` does not import the Jobs API client (its asyncio costs every start ~30 ms);
    positive control: `submit`, which talks to the Jobs API, does."""
    probe = (
        "import sys\n"
        "from provisioner.cli import app_for\n"
        "app_for([sys.argv[1]])\n"
        "print('asyncio' in sys.modules, 'provisioner.jobs' in sys.modules)\n"
    )

    def imported(command: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", probe, command], capture_output=True, text=True, check=True
        )
        return done.stdout.split()

    assert imported("up") == ["False", "False"]
    assert imported("submit") == ["True", "True"]
