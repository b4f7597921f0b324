"""The SSH engine's pure parts: command builders, results, fan-out, error translation."""

from __future__ import annotations

import errno
import socket
import time
from pathlib import Path

import paramiko
import pytest

from provisioner.errors import CommandFailed, ConnectError, RemoteError
from provisioner.inventory import Node, SSHSettings
from provisioner.remote import Result, fan_out
from provisioner.remote.commands import command, login_shell, masked, script, sudo
from provisioner.remote.hostkeys import host_key_name
from provisioner.remote.translate import translate


def test_command_quotes_every_value() -> None:
    assert command("docker", "load", "-i", "a b;rm -rf /") == "docker load -i 'a b;rm -rf /'"
    assert command("echo", "$(id)") == "echo '$(id)'"
    assert sudo("ss -tlnp") == "sudo -n sh -c 'ss -tlnp'"
    assert login_shell("ray --version") == "bash --login -i -c 'ray --version'"
    assert script("bash", ["10.0.0.1", "", 5]) == "bash -s -- 10.0.0.1 '' 5"


def test_masking() -> None:
    cmd = "env RAY_AUTH_TOKEN='s3cr et' ray start"
    assert masked(cmd, ["s3cr et"]) == "env RAY_AUTH_TOKEN=*** ray start"


def test_result_tail_and_check() -> None:
    good = Result("h", "true", "out\n", "", 0)
    assert good.ok and good.check() is good
    bad = Result("h", "make", "", "\n".join(f"line {i}" for i in range(20)), 2)
    assert bad.tail(2) == "line 18\nline 19"
    with pytest.raises(CommandFailed) as caught:
        bad.check("try again")
    assert "exited with 2" in str(caught.value) and "line 19" in str(caught.value)
    assert caught.value.fix == "try again"


NODES = [Node(f"n{i}", f"10.0.0.{i}", "worker", SSHSettings(user="u")) for i in range(6)]


def test_fan_out_isolates_failures_and_bounds_time() -> None:
    def step(node: Node) -> str:
        if node.name == "n1":
            raise RemoteError(node.name, "boom", kind="remote")
        if node.name == "n2":
            raise KeyError("bug")
        if node.name == "n3":
            time.sleep(5)
        return node.name.upper()

    t0 = time.monotonic()
    group = fan_out(NODES, step, parallelism=3, deadline=0.5)
    assert time.monotonic() - t0 < 2
    assert group.results == {"n0": "N0", "n4": "N4", "n5": "N5"}
    assert {k: e.kind for k, e in group.errors.items()} == {
        "n1": "remote",
        "n2": "internal",
        "n3": "deadline",
    }
    assert not group.ok and group.failed is group.errors


def test_fan_out_runs_nodes_at_once_up_to_the_bound() -> None:
    import threading

    lock, running, peak = threading.Lock(), [0], [0]

    def step(node: Node) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1

    assert fan_out(NODES, step, parallelism=4, deadline=10).ok
    assert peak[0] == 4


def tr(exc: BaseException, port: int = 22, keys: tuple[Path, ...] = ()) -> ConnectError:
    error = translate(
        exc, host="n", address="10.0.0.1", port=port, user="u", keys=keys, known_hosts=(), timeout=3
    )
    assert isinstance(error, ConnectError)
    return error


def test_translate_kinds() -> None:
    assert tr(socket.gaierror(-2, "Name or service not known")).kind == "dns"
    refused = paramiko.ssh_exception.NoValidConnectionsError(
        {("10.0.0.1", 22): OSError(errno.ECONNREFUSED, "r")}
    )
    assert tr(refused).kind == "refused"
    assert tr(TimeoutError()).kind == "timeout"
    assert tr(OSError(errno.EHOSTUNREACH, "no route")).kind == "unreachable"
    assert tr(paramiko.SSHException("Error reading SSH protocol banner")).kind == "banner-timeout"
    auth = tr(paramiko.AuthenticationException("x"), keys=(Path("/k/id"),))
    assert auth.kind == "auth" and "/k/id" in (auth.fix or "")


def test_translate_changed_host_key_gives_exact_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = paramiko.RSAKey.generate(1024)
    new = paramiko.RSAKey.generate(1024)
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.0.0.1]:2222 {old.get_name()} {old.get_base64()}\n")
    error = translate(
        paramiko.BadHostKeyException("[10.0.0.1]:2222", new, old),
        host="n",
        address="10.0.0.1",
        port=2222,
        user="u",
        keys=(),
        known_hosts=(known,),
        timeout=3,
    )
    assert isinstance(error, ConnectError) and error.kind == "hostkey-changed"
    assert f"ssh-keygen -f {known} -R '[10.0.0.1]:2222'" in (error.fix or "")


def test_host_key_name() -> None:
    assert host_key_name("10.0.0.1", 22) == "10.0.0.1"
    assert host_key_name("10.0.0.1", 2222) == "[10.0.0.1]:2222"


def test_output_past_the_cap_is_drained_counted_and_said() -> None:
    from provisioner.remote.session import _KEEP_TAIL, _Capped

    kept = _Capped(1000)
    for i in range(100):
        kept.add(bytes([65 + i % 26]) * 10_000)  # 1 MB in all
    text = kept.value()
    assert text.startswith(b"A" * 1000)
    tail = text.split(b"(cap 1000)]\n", 1)[1]
    assert 1000 + kept.dropped + len(tail) == 1_000_000  # every byte kept or counted
    assert b"bytes of output left out (cap 1000)" in text
    assert len(text) <= 1000 + 2 * _KEEP_TAIL + 100
    assert text.endswith(bytes([65 + 99 % 26]) * 10_000)
    small = _Capped(1000)
    small.add(b"ok\n")
    assert (small.value(), small.dropped) == (b"ok\n", 0)


def _keys() -> tuple[paramiko.PKey, paramiko.PKey]:
    return paramiko.Ed25519Key.from_private_key_file(
        _keyfile("a")
    ), paramiko.Ed25519Key.from_private_key_file(_keyfile("b"))


def _keyfile(name: str) -> str:
    import subprocess
    import tempfile

    path = Path(tempfile.mkdtemp()) / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)


def test_known_hosts_markers_are_read_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.remote.hostkeys import VerifyPolicy, load_known_hosts

    monkeypatch.setenv("HOME", str(tmp_path))
    good, revoked = _keys()
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.example.org ssh-ed25519 {good.get_base64()}\n"
        f"@revoked * ssh-ed25519 {revoked.get_base64()}\n"
        "this line is not a host key at all\n"
        f"10.0.0.1 ssh-ed25519 {good.get_base64()}\n"
        f"10.0.0.2 ssh-ed25519 {revoked.get_base64()}\n"
    )
    client = paramiko.SSHClient()
    read = load_known_hosts(client, (known,))  # paramiko alone raises InvalidHostKey here
    assert client.get_host_keys().lookup("10.0.0.1") is not None
    assert client.get_host_keys().lookup("10.0.0.2") is None  # revoked wins over listed
    assert read.revoked == {("ssh-ed25519", revoked.get_base64())}
    # a host presenting the revoked key is refused, even under accept-new
    policy = VerifyPolicy("w", True, tmp_path / "record", read.revoked)
    with pytest.raises(ConnectError, match="@revoked") as caught:
        policy.missing_host_key(client, "10.0.0.2", revoked)
    assert caught.value.kind == "hostkey-revoked" and caught.value.fix
    assert not (tmp_path / "record").exists()


def test_hashed_known_hosts_lines_match_the_names_openssh_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference is OpenSSH's own `ssh-keygen -H` (Debian's ssh_config hashes every
    name it records); each line matches its own name only, as paramiko's hash_host says."""
    import subprocess

    from provisioner.remote.hostkeys import _matches, load_known_hosts

    monkeypatch.setenv("HOME", str(tmp_path))
    good, _ = _keys()
    names = ["node-a", "[10.0.0.5]:2222", "10.0.0.6", "example.org"]
    known = tmp_path / "known_hosts"
    known.write_text("".join(f"{n} ssh-ed25519 {good.get_base64()}\n" for n in names))
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    patterns = [line.split()[0] for line in known.read_text().splitlines()]
    assert all(p.startswith("|1|") for p in patterns) and len(patterns) == len(names)
    for i, pattern in enumerate(patterns):
        for j, name in enumerate(names):
            assert _matches(pattern, name) is (i == j), (pattern, name)
            assert _matches(pattern, name) is (
                paramiko.HostKeys.hash_host(name, pattern) == pattern
            )
    client = paramiko.SSHClient()
    load_known_hosts(client, (known,), name="[10.0.0.5]:2222")
    assert client.get_host_keys().lookup("[10.0.0.5]:2222") is not None
    assert client.get_host_keys().lookup("node-a") is None  # only its own name was taught
    for bad in ("|1|", "|1|x|y", "|2|" + patterns[0][3:], patterns[0] + "|", "|1|@@@@|@@@@"):
        assert not _matches(bad, "node-a"), bad


def test_known_hosts_and_key_files_changed_between_connections_are_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files are read once per version: a key recorded (accept-new) or a file edited after
    an earlier connection of the same process is what the next connection sees."""
    import os

    from provisioner.remote.auth import load_key
    from provisioner.remote.hostkeys import load_known_hosts, record

    monkeypatch.setenv("HOME", str(tmp_path))
    first, second = _keys()
    known = tmp_path / "known_hosts"
    known.write_text(f"10.0.0.1 ssh-ed25519 {first.get_base64()}\n")
    before = paramiko.SSHClient()
    load_known_hosts(before, (known,), name="10.0.0.2")
    assert before.get_host_keys().lookup("10.0.0.2") is None
    record(known, "10.0.0.2", second)
    after = paramiko.SSHClient()
    load_known_hosts(after, (known,), name="10.0.0.2")
    found = after.get_host_keys().lookup("10.0.0.2")
    assert found is not None and found["ssh-ed25519"].get_base64() == second.get_base64()

    key = tmp_path / "id_ed25519"
    key.write_bytes(Path(_keyfile("c")).read_bytes())
    key.chmod(0o600)
    old = load_key(key)
    assert isinstance(old, paramiko.PKey)
    key.write_bytes(Path(_keyfile("d")).read_bytes())  # the user put another key there
    later = key.stat().st_mtime_ns + 10**9
    os.utime(key, ns=(later, later))
    new = load_key(key)
    assert isinstance(new, paramiko.PKey) and new.get_base64() != old.get_base64()


def test_a_key_learned_through_a_jump_host_is_not_trusted_directly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.remote.hostkeys import (
        VerifyPolicy,
        jumped_name,
        load_known_hosts,
        read_known_hosts,
    )

    monkeypatch.setenv("HOME", str(tmp_path))
    learned, pinned = _keys()
    record = tmp_path / "known_hosts"
    jumped = host_key_name(jumped_name("10.0.0.5", "lab@head:22"), 2222)
    client = paramiko.SSHClient()
    policy = VerifyPolicy("w", True, record, set())
    policy.missing_host_key(client, jumped, learned)  # accept-new, through the jump host
    assert read_known_hosts(record).lookup(jumped)
    assert not read_known_hosts(record).lookup(host_key_name("10.0.0.5", 2222))
    direct = paramiko.SSHClient()
    load_known_hosts(direct, (record,))
    assert direct.get_host_keys().lookup("[10.0.0.5]:2222") is None
    # a key the user pinned for the plain name is still trusted through the jump host
    record.write_text(f"[10.0.0.5]:2222 ssh-ed25519 {pinned.get_base64()}\n")
    via = paramiko.SSHClient()
    load_known_hosts(via, (record,), alias=(jumped, "[10.0.0.5]:2222"))
    found = via.get_host_keys().lookup(jumped)
    assert found is not None and found["ssh-ed25519"].get_base64() == pinned.get_base64()


def test_passwd_with_home_changes_only_that_entry() -> None:
    from tests.account_home import passwd_with_home

    text = "root:x:0:0:root:/root:/bin/bash\nlab:x:1000:1000::/home/lab:/bin/sh\n"
    changed = passwd_with_home(text, 0, Path("/tmp/h"))
    assert changed == "root:x:0:0:root:/tmp/h:/bin/bash\nlab:x:1000:1000::/home/lab:/bin/sh\n"
    assert passwd_with_home(text, 1000, Path("/x")).splitlines()[0] == text.splitlines()[0]


def test_an_authentication_cut_short_is_not_a_refusal_and_a_push_retries_it() -> None:
    """An overloaded sshd that does not answer within the timeout, or a transport that
    drops mid-way, is not the server refusing the key: it is named as such, and a push
    (whose retries reconnect) tries again. Positive control: a real refusal stays `auth`."""
    from paramiko.auth_strategy import AuthResult, AuthStrategy, SourceResult

    from provisioner.remote.auth import KeysRefused
    from provisioner.runtime.docker.direct import RETRYABLE

    def refused_with(*reasons: Exception) -> KeysRefused:
        result = AuthResult(strategy=AuthStrategy(ssh_config=paramiko.SSHConfig()))
        result.extend(SourceResult(source=f"k{i}", result=r) for i, r in enumerate(reasons))
        return KeysRefused(result, ())

    no = paramiko.AuthenticationException("Authentication failed.")
    late = paramiko.AuthenticationException("Authentication timeout.")
    gone = paramiko.AuthenticationException("Authentication failed: transport shut down or saw EOF")
    assert tr(refused_with(no)).kind == "auth"
    assert tr(refused_with(no, no)).kind == "auth"
    for cut in (late, gone, EOFError(), paramiko.SSHException("No existing session")):
        error = tr(refused_with(no, cut))
        assert error.kind == "auth-timeout", cut
        assert "refused" not in str(error) and "did not finish authenticating" in str(error)
    assert "auth-timeout" in RETRYABLE and "auth" not in RETRYABLE


def test_aes_gcm_goes_first_and_nothing_else_changes() -> None:
    from provisioner.remote.session import preferred_ciphers

    theirs = paramiko.Transport._preferred_ciphers
    ours = preferred_ciphers(theirs)
    assert ours[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert sorted(ours) == sorted(theirs)
    rest = [c for c in theirs if "gcm" not in c]
    assert list(ours[2:]) == rest  # paramiko's own order after them
    # a paramiko without GCM (or with it disabled): its order, untouched
    assert preferred_ciphers(tuple(rest)) == tuple(rest)


def test_a_client_transport_offers_aes_gcm_first() -> None:
    from provisioner.remote.session import _transport

    a, b = socket.socketpair()
    try:
        transport = _transport(a)
        assert transport.get_security_options().ciphers[0] == "aes128-gcm@openssh.com"
        disabled = _transport(b, disabled_algorithms={"ciphers": ["aes128-gcm@openssh.com"]})
        assert disabled.preferred_ciphers[0] == "aes256-gcm@openssh.com"
    finally:
        a.close()
        b.close()


def test_a_client_socket_sends_small_messages_at_once() -> None:
    from provisioner.remote.session import _transport, no_delay

    listener = socket.create_server(("127.0.0.1", 0))
    tcp = socket.create_connection(listener.getsockname())
    a, b = socket.socketpair()
    try:
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the control
        _transport(tcp)
        assert tcp.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        no_delay(a)  # not TCP (a proxy's pipe, a jump host's channel): left alone
    finally:
        for sock in (listener, tcp, a, b):
            sock.close()


def _global_request(kind: str, want_reply: bool) -> paramiko.Message:
    m = paramiko.Message()
    m.add_string(kind)
    m.add_boolean(want_reply)
    m.rewind()
    return m


def test_an_unsolicited_server_request_is_acknowledged_with_data_at_once() -> None:
    """sshd's host key notice after authentication wants no reply; without one from us its
    next message (the first channel's confirmation) waited for our delayed ACK."""
    from provisioner.remote.session import _transport

    a, b = socket.socketpair()
    try:
        transport = _transport(a)
        sent: list[int | None] = []
        transport.send_ignore = sent.append  # type: ignore[method-assign]
        transport.clear_to_send.set()
        transport._parse_global_request(_global_request("hostkeys-00@openssh.com", False))
        assert sent == [1]
        # during a key exchange (this is the thread that must finish it, and a send would
        # wait for that): nothing is sent
        transport.clear_to_send.clear()
        transport._parse_global_request(_global_request("hostkeys-00@openssh.com", False))
        assert sent == [1]
    finally:
        a.close()
        b.close()


class _PacketChannel:
    """A channel that takes at most 32 KiB per send, as paramiko's does (its sshd's packet
    size), with paramiko's own sendall loop; it keeps what arrived and what it was handed."""

    sendall = paramiko.Channel.sendall  # paramiko's loop: send, then slice what is left

    def __init__(self) -> None:
        self.arrived = bytearray()
        self.handed: list[object] = []
        self.shut = False

    def send(self, s: bytes | memoryview) -> int:
        self.handed.append(s)
        n = min(len(s), 32 << 10)
        self.arrived += s[:n]
        return n

    def shutdown_write(self) -> None:
        self.shut = True


def test_a_stream_arrives_whole_and_no_chunk_is_copied_per_packet() -> None:
    from provisioner.remote.session import _Sender

    chunks = [bytes([i]) * (1 << 20) + bytes(range(i + 1)) for i in range(4)]
    channel = _PacketChannel()
    totals: list[int] = []
    sender = _Sender(channel, iter(chunks), totals.append)  # type: ignore[arg-type]
    sender.join(10)
    assert sender.error is None and channel.shut
    assert bytes(channel.arrived) == b"".join(chunks)  # whole, in order
    assert totals == [sum(map(len, chunks[: i + 1])) for i in range(4)]
    # each packet read from a view of the chunk itself: paramiko's slicing copies nothing
    # (a bytes chunk would be copied again after every 32 KiB packet: 16 MiB per MiB)
    assert len(channel.handed) > 4 * 32
    assert all(isinstance(s, memoryview) for s in channel.handed)
    assert {id(s.obj) for s in channel.handed if isinstance(s, memoryview)} == set(map(id, chunks))
    # paramiko packs a view's bytes as it packs bytes (its stubs name bytes only)
    piece = chunks[1][:100]
    as_view = paramiko.Message().add_string(memoryview(piece))  # type: ignore[arg-type]
    assert as_view.asbytes() == paramiko.Message().add_string(piece).asbytes()
