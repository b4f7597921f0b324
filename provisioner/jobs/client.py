"""A Jobs API client that carries the cluster's token, with Ray's errors translated.

The token goes in the `Authorization: Bearer` header given explicitly to
`JobSubmissionClient`, never through process-wide variables or ~/.ray/auth_token, so one
process can talk to several clusters and a test can talk without a token.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from provisioner.errors import OperationError
from provisioner.node.token import read_token_file


@contextmanager
def ray_client_quiet() -> Iterator[None]:
    """Hold Ray's own client-side lines to warnings while it runs ("Uploading package ...",
    "WebSocket closed ..."): they are Ray talking on the control machine, not the job, and
    the library never prints. The job's own output is streamed as before."""
    import ray  # noqa: F401  (importing Ray gives its "ray" logger a handler)

    # Ray's client modules set their own loggers to INFO; their records reach the handler
    # of the "ray" logger, so the handler is what holds them back.
    handlers = logging.getLogger("ray").handlers
    before = [h.level for h in handlers]
    for handler in handlers:
        handler.setLevel(max(handler.level, logging.WARNING))
    try:
        yield
    finally:
        for handler, level in zip(handlers, before, strict=True):
            handler.setLevel(level)


class AuthRefused(OperationError):
    """The dashboard refused the request: token missing or wrong."""


def auth_headers(token: str | None) -> dict[str, str]:
    """The HTTP headers Ray's token authentication expects (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def connect(dashboard_url: str, token_path: Path | None) -> Any:
    """A `JobSubmissionClient` for `dashboard_url`, authenticated with the token in `token_path`."""
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    token = read_token_file(token_path) if token_path is not None else None
    try:
        client = JobSubmissionClient(dashboard_url, headers=auth_headers(token))
        client.list_jobs()  # the version probe does not always need the token; this does
    except AuthenticationError as exc:
        raise refused(dashboard_url, token is not None) from exc
    except ConnectionError as exc:
        raise OperationError(
            f"cannot reach Ray's Jobs API at {dashboard_url}",
            "check that the cluster is up (`provisioner status`) and the tunnel is open",
        ) from exc
    except (RuntimeError, ValueError, KeyError, TypeError, OSError) as exc:
        # Ray's client reads the answers to its version probe and its first request
        # without a guard: an HTTP error, a body that is not JSON or JSON without
        # "ray_version" (a dashboard still starting, or another server on that port);
        # requests' errors are OSErrors
        raise OperationError(
            f"Ray's Jobs API at {dashboard_url} gave an answer Ray's client cannot read "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            "check that the cluster is up (`provisioner status`) and that the inventory's "
            "dashboard port is Ray's dashboard; a head that has just started answers in a "
            "few seconds: try again",
        ) from exc
    return client


# The most bytes of a job's log (Ray's JSON answer) held on this machine at once; a job's
# output is the job's to choose, so it is read with a bound, never whole.
JOB_LOG_CAP = 64 * 1024 * 1024


def read_bounded(chunks: Iterable[bytes], cap: int) -> bytes | None:
    """The bytes of `chunks` when they add up to at most `cap`; None (reading stops there)
    when there are more."""
    kept: list[bytes] = []
    size = 0
    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            return None
        kept.append(chunk)
    return b"".join(kept)


def job_log(client: Any, job_id: str, cap: int = JOB_LOG_CAP) -> str | None:
    """The job's whole log from Ray's Jobs API (what `get_job_logs` answers), read with a
    bound: None when Ray's answer is over `cap` bytes (the head keeps the log; `jobs logs
    --follow` streams it line by line)."""
    response = client._do_request("GET", f"/api/jobs/{job_id}/logs", stream=True)
    try:
        if response.status_code != 200:
            client._raise_error(response)
        body = read_bounded(response.iter_content(1 << 20), cap)
    finally:
        response.close()
    if body is None:
        return None
    try:
        logs = json.loads(body)["logs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise OperationError(
            f"Ray's Jobs API sent an unreadable log for job {job_id}",
            "check the cluster's Ray version (`provisioner doctor`)",
        ) from exc
    return str(logs)


def refused(dashboard_url: str, had_token: bool) -> AuthRefused:
    """The error for a request the cluster refused for authentication."""
    if had_token:
        return AuthRefused(
            f"the cluster at {dashboard_url} refused the token (authentication failed)",
            "the local token does not match the cluster's; run `provisioner up` to reinstall it",
        )
    return AuthRefused(
        f"the cluster at {dashboard_url} requires a token and none was sent",
        "submit with the cluster's token (`provisioner submit -i INVENTORY` finds it)",
    )
