"""The forwarding relay's plan: chain order, what each hop cuts, re-feeding, byte accounting,
and the hop script run by real sh, tee and tar on a local stream."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest
import typer

from provisioner.image.savestream import read_saved
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.chain_plan import (
    FOREIGN_RC,
    Chain,
    Hop,
    chain_order,
    drop_sender_files_command,
    edge_key_lifetime_s,
    feed_command,
    first_chain,
    guarded_load_lines,
    hop_command,
    hop_script,
    layer_members,
    parse_received,
    parse_round_result,
    private_file_command,
    refeed_chain,
    round_result_command,
    sent_bytes,
    write_hop_command,
)
from provisioner.runtime.docker.push_plan import NodePlan
from provisioner.runtime.docker.star import RELAY_COMMAND, authorized_line, make_relay_key


def plan(first_missing: int, action: str = "send") -> NodePlan:
    return NodePlan(action, first_missing)  # type: ignore[arg-type]


def saved_image(tmp: Path, layers: int = 3) -> Path:
    """A `docker save`-shaped tar (legacy layout): layer i in d<i>/layer.tar; layer 2's
    file is a link to layer 0's (docker writes a link for a layer seen twice)."""
    path = tmp / "image.tar"
    names = [f"d{i}/layer.tar" for i in range(layers)]
    with tarfile.open(path, "w") as tar:
        for i, name in enumerate(names):
            if i == 2:
                link = tarfile.TarInfo(name)
                link.type, link.linkname = tarfile.SYMTYPE, "../d0/layer.tar"
                tar.addfile(link)
                continue
            data = bytes([65 + i]) * 3000
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        manifest = f'[{{"Config": "abc.json", "Layers": {names!r}}}]'.replace("'", '"')
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest.encode()))
    return path


def test_the_chain_takes_nodes_lacking_most_first_and_skips_nodes_that_hold_everything() -> None:
    plans = {
        "w2": plan(2),
        "head": plan(0),
        "w1": plan(0),
        "w3": plan(3, "none"),
        "w4": plan(3, "tag"),
    }
    assert chain_order(plans, ["head", "w1", "w2", "w3", "w4"]) == ["head", "w1", "w2"]


def test_a_hop_cuts_the_layers_the_next_node_holds_and_keeps_linked_files(tmp_path: Path) -> None:
    saved = read_saved(saved_image(tmp_path))
    # layer 2 links to layer 0's file: holding layers 0-1 still needs d0/layer.tar
    assert layer_members(saved, 2) == {"d1/layer.tar"}
    assert layer_members(saved, 0) == set()
    chain = first_chain(["a", "b", "c"], {"a": plan(0), "b": plan(0), "c": plan(2)}, saved)
    assert chain.feeder is None and chain.first_missing == 0
    assert [(h.node, h.next, h.drop) for h in chain.hops] == [
        ("a", "b", ()),
        ("b", "c", ("d1/layer.tar",)),
        ("c", None, ()),
    ]
    with pytest.raises(ValueError):  # different needs without the index: refused, not guessed
        first_chain(["a", "c"], {"a": plan(0), "c": plan(2)}, None)


def test_refeeding_takes_the_holder_that_sent_least_or_the_control_machine() -> None:
    chain = refeed_chain(["c", "d"], ["a", "b"], {"a": 100, "b": 10})
    assert chain.feeder == "b"
    assert [(h.node, h.next) for h in chain.hops] == [("c", "d"), ("d", None)]
    assert refeed_chain(["c"], [], {}).feeder is None


def test_each_sender_is_charged_what_its_next_node_received() -> None:
    chain = Chain(None, (Hop("a", 0, "b"), Hop("b", 0, "c"), Hop("c", 0)))
    assert chain.sender_of("a") == "control" and chain.sender_of("c") == "b"
    assert sent_bytes(chain, {"a": 10, "b": 9, "c": 7}) == {"control": 10, "a": 9, "b": 7}
    again = Chain("a", (Hop("c", 0),))
    assert sent_bytes(again, {"c": 10}) == {"a": 10}
    assert parse_received("1234\n") == 1234 and parse_received("") == 0


def test_commands_are_quoted() -> None:
    ssh = ("ssh", "-i", "/tmp/d ir/key", "u@10.0.0.2", "hop")
    outer = shlex.split(feed_command("sha256:ab", ssh))
    assert outer[:2] == ["bash", "-c"]
    assert (
        outer[2] == "set -o pipefail; docker save sha256:ab | ssh -i '/tmp/d ir/key' u@10.0.0.2 hop"
    )
    assert hop_command("/tmp/tmp.x1") == "sh /tmp/tmp.x1/hop"


def _fake_bin(tmp: Path) -> Path:
    """`docker load` and `ssh` stand-ins that keep what they read, to run the hop script
    with the real sh, tee, tar and wc (the lab runs it on real nodes)."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp}/docker-calls\n'
        'case "$1" in\n'
        f"load) cat > {tmp}/loaded; cat {tmp}/load-says 2>/dev/null "
        "|| echo 'Loaded image ID: sha256:1' ;;\n"
        f"image) cat {tmp}/tags-now 2>/dev/null ;;\n"
        "esac\n"
    )
    (bin_ / "ssh").write_text(f"#!/bin/sh\ncat > {tmp}/forwarded\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    return bin_


def run_hop(tmp: Path, script: str, stream: bytes) -> subprocess.CompletedProcess[bytes]:
    (tmp / "hop").write_text(script)
    env = {"PATH": f"{_fake_bin(tmp)}:/usr/bin:/bin"}
    return subprocess.run(
        ["sh", str(tmp / "hop")], input=stream, env=env, capture_output=True, check=False
    )


def test_the_hop_loads_forwards_without_the_cut_files_and_counts_what_it_received(
    tmp_path: Path,
) -> None:
    image = saved_image(tmp_path)
    stream = image.read_bytes()
    work = tmp_path / "relay"
    work.mkdir()
    script = hop_script(str(work), ("ssh", "next", "hop"), ("d1/layer.tar",))
    done = run_hop(work, script, stream)
    assert done.returncode == 0, done.stderr
    assert (work / "loaded").read_bytes() == stream
    with tarfile.open(work / "forwarded") as tar:
        forwarded = tar.getnames()
    assert forwarded == ["d0/layer.tar", "d2/layer.tar", "manifest.json"]
    assert int((work / "received").read_text()) == len(stream)


def test_a_tag_the_stream_carries_is_removed_and_the_nodes_own_tagged_again(
    tmp_path: Path,
) -> None:
    """A pin's stream is a `docker save` by ID: `docker load` names no tag. A sender that
    puts tags in its stream gets them removed on the receiver (the receiver's own image of
    that name tagged again), the hop exits FOREIGN_RC, and the control machine reads the
    tags; a stream with none goes through (positive control)."""
    work = tmp_path / "relay"
    work.mkdir()
    script = hop_script(str(work), None, ())
    assert "docker image ls --no-trunc --format" in script
    assert "sed -n 's/^Loaded image: //p' load.out > foreign" in script
    (work / "tags-now").write_text("ubuntu:22.04 sha256:own\n<none>:<none> sha256:x\n")
    (work / "load-says").write_text(
        "Loaded image: ubuntu:22.04\nLoaded image: evil/new:1\nLoaded image ID: sha256:p\n"
    )
    done = run_hop(work, script, b"stream")
    assert done.returncode == FOREIGN_RC, done.stderr
    calls = (work / "docker-calls").read_text().splitlines()
    assert calls == [
        "image ls --no-trunc --format {{.Repository}}:{{.Tag}} {{.ID}}",
        "load",
        "rmi --no-prune ubuntu:22.04",
        "tag sha256:own ubuntu:22.04",  # the node's own image of that name, tagged again
        "rmi --no-prune evil/new:1",  # no image of that name before: only removed
    ]
    result = subprocess.run(
        ["sh", "-c", round_result_command(str(work))], capture_output=True, text=True
    )
    assert parse_round_result(result.stdout) == (6, ["ubuntu:22.04", "evil/new:1"])

    (work / "load-says").write_text("Loaded image ID: sha256:p\n")  # a pin's stream
    subprocess.run(["sh", "-c", write_hop_command(str(work))], input=script.encode(), check=True)
    (work / "docker-calls").unlink()
    assert run_hop(work, script, b"pin").returncode == 0
    assert [c.split()[0] for c in (work / "docker-calls").read_text().splitlines()] == [
        "image",
        "load",
    ]
    result = subprocess.run(
        ["sh", "-c", round_result_command(str(work))], capture_output=True, text=True
    )
    assert parse_round_result(result.stdout) == (3, [])


def _sshd_forced_command(line: str) -> str:
    """The command of an authorized_keys line's `command="..."`, read as sshd reads it
    (auth-options.c, opt_dequote: \\" is a quote, any other character is itself)."""
    rest = line.split(',command="', 1)[1]
    out, i = [], 0
    while rest[i] != '"':
        if rest[i] == "\\" and rest[i + 1] == '"':
            i += 1
        out.append(rest[i])
        i += 1
    return "".join(out)


def test_the_stars_workers_load_through_the_hops_guard(tmp_path: Path) -> None:
    """The star's relay key runs, on each worker, the same guarded `docker load` as a
    chain hop (`guarded_load_lines`), in a private folder it removes: a tag the head puts
    in its stream is removed and the worker's own image of that name tagged again, exit
    FOREIGN_RC; a pin's stream (positive control) loads, exit 0, `docker load`'s output
    on stdout for the head to read."""
    line = authorized_line(make_relay_key(), "10.0.0.1", "20260101120000Z")
    command = _sshd_forced_command(line)
    assert command == RELAY_COMMAND
    assert shlex.split(command)[:2] == ["sh", "-c"]
    assert "; ".join(guarded_load_lines()) in shlex.split(command)[2]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"PATH": f"{_fake_bin(tmp_path)}:/usr/bin:/bin", "TMPDIR": str(tmp)}

    def worker(stream: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # sshd runs a forced command with the user's shell's -c
            ["bash", "-c", command],
            input=stream,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    (tmp_path / "tags-now").write_text("ubuntu:22.04 sha256:own\n")
    (tmp_path / "load-says").write_text(
        "Loaded image: ubuntu:22.04\nLoaded image: evil/new:1\nLoaded image ID: sha256:p\n"
    )
    done = worker("stream")
    assert done.returncode == FOREIGN_RC, done.stderr
    assert (tmp_path / "loaded").read_text() == "stream"
    assert (tmp_path / "docker-calls").read_text().splitlines() == [
        "image ls --no-trunc --format {{.Repository}}:{{.Tag}} {{.ID}}",
        "load",
        "rmi --no-prune ubuntu:22.04",
        "tag sha256:own ubuntu:22.04",
        "rmi --no-prune evil/new:1",
    ]
    assert not list(tmp.iterdir())  # its folder removed

    (tmp_path / "load-says").write_text("Loaded image ID: sha256:p\n")  # a pin's stream
    (tmp_path / "docker-calls").unlink()
    done = worker("pin")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Loaded image ID: sha256:p\n"
    assert [c.split()[0] for c in (tmp_path / "docker-calls").read_text().splitlines()] == [
        "image",
        "load",
    ]
    assert not list(tmp.iterdir())


def test_round_result_is_read_by_string() -> None:
    assert round_result_command("/tmp/d ir") == (
        "cat '/tmp/d ir'/received; echo; sed 's/^/tag: /' '/tmp/d ir'/foreign 2>/dev/null; true"
    )
    assert parse_round_result("12\ntag: a:1\ntag: b\n") == (12, ["a:1", "b"])
    assert parse_round_result("") == (0, [])
    assert parse_round_result("\ntag: x\n") == (0, ["x"])


def test_a_failing_load_does_not_stop_the_forwarding(tmp_path: Path) -> None:
    work = tmp_path / "relay"
    work.mkdir()
    bin_ = _fake_bin(work)
    (bin_ / "docker").write_text("#!/bin/sh\nhead -c 10 >/dev/null; exit 1\n")
    stream = b"x" * 5_000_000
    (work / "hop").write_text(hop_script(str(work), ("ssh", "next", "hop"), ()))
    env = {"PATH": f"{bin_}:/usr/bin:/bin"}
    done = subprocess.run(
        ["sh", str(work / "hop")], input=stream, env=env, capture_output=True, check=False
    )
    assert done.returncode == 1  # the load's own status
    assert (work / "forwarded").read_bytes() == stream  # the next node got it all


def test_the_last_hop_only_loads(tmp_path: Path) -> None:
    work = tmp_path / "relay"
    work.mkdir()
    script = hop_script(str(work), None, ())
    assert "ssh" not in script and "fwd" not in script.split("\n", 3)[3]
    done = run_hop(work, script, b"abc")
    assert done.returncode == 0 and (work / "loaded").read_bytes() == b"abc"


def test_a_hop_runs_once_per_round(tmp_path: Path) -> None:
    """The edge key's forced command loads one stream: a second start in the same round
    is refused, and writing the round's hop script again allows one more."""
    work = tmp_path / "relay"
    work.mkdir()
    script = hop_script(str(work), None, ())
    assert run_hop(work, script, b"abc").returncode == 0
    again = run_hop(work, script, b"hostile")
    assert again.returncode == 3 and b"received its stream already" in again.stderr
    assert (work / "loaded").read_bytes() == b"abc"  # the second stream never loaded
    subprocess.run(["sh", "-c", write_hop_command(str(work))], input=script.encode(), check=True)
    assert run_hop(work, script, b"next round").returncode == 0
    assert (work / "loaded").read_bytes() == b"next round"


def test_round_edges_and_their_commands() -> None:
    chain = Chain(None, (Hop("a", 0, "b"), Hop("b", 0, "c"), Hop("c", 0)))
    assert chain.edges() == [("a", "b"), ("b", "c")]  # the control machine's needs no key
    refeed = Chain("h", (Hop("x", 0, "y"), Hop("y", 0)))
    assert refeed.edges() == [("h", "x"), ("x", "y")]
    assert Chain("h", ()).edges() == []
    assert write_hop_command("/tmp/d ir") == "rm -rf '/tmp/d ir'/started && cat > '/tmp/d ir'/hop"
    assert private_file_command("/tmp/d ir", "send.key") == (
        "umask 077 && cat > '/tmp/d ir'/send.key"
    )
    assert drop_sender_files_command("/tmp/d ir") == (
        "rm -f '/tmp/d ir'/send.key '/tmp/d ir'/send.known_hosts"
    )


def test_an_edge_key_lives_minutes_not_the_push() -> None:
    """sshd checks expiry-time when a connection authenticates; every edge connects as
    the round starts, one hop after the other, each within its connect timeout."""
    assert edge_key_lifetime_s(2, 10) == 60 + 2 * 25
    assert edge_key_lifetime_s(0, 10) == 85
    assert edge_key_lifetime_s(10, 3.9) == 60 + 10 * 18


def test_up_push_modes_choose_the_push() -> None:
    from provisioner.runtime.docker.delivery import push_options

    assert push_options("direct") == PushOptions()
    assert push_options("auto") == PushOptions(chain=True, chain_from=2)
    assert push_options("chain") == PushOptions(chain=True, chain_from=1)


def test_up_with_an_unknown_push_mode_is_exit_2(tmp_path: Path) -> None:
    from tests.cli import cli

    (tmp_path / "inv.yaml").write_text(
        "cluster: t\nhead: {name: h, address: 10.250.9.10}\nworkers: []\n"
    )
    result = cli("up", "-i", str(tmp_path / "inv.yaml"), "--push", "star")
    assert result.exit_code == 2
    assert "not a push mode" in result.stderr and "auto, direct, chain" in result.stderr


def test_image_push_with_both_relays_is_exit_2(tmp_path: Path) -> None:
    from tests.cli import cli

    (tmp_path / "inv.yaml").write_text(
        "cluster: t\nimage: {lock: x.json}\nhead: {name: h, address: 10.250.9.10}\nworkers: []\n"
    )
    (tmp_path / "x.json").write_text("{}")
    for both in (["--star", "--chain"], ["--relay", "--forward"]):  # the old names too
        result = cli("image", "push", "-i", str(tmp_path / "inv.yaml"), *both)
        assert result.exit_code == 2
        assert "choose one" in result.stderr


def test_image_push_old_flags_are_deprecated_aliases_of_star_and_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--relay` and `--forward` still work: each says it is a deprecated alias and pushes
    the shape of its new word (PushOptions.star, PushOptions.chain)."""
    from provisioner.cluster import deliver
    from tests.cli import cli

    (tmp_path / "inv.yaml").write_text(
        "cluster: t\nimage: {lock: x.json}\nhead: {name: h, address: 10.250.9.10}\nworkers: []\n"
    )
    seen: list[PushOptions] = []

    def fake_deliver(cluster: object, report: object, *, options: PushOptions) -> None:
        seen.append(options)
        raise typer.Exit(0)

    monkeypatch.setattr(deliver, "deliver_pin", fake_deliver)
    monkeypatch.setattr("provisioner.cli.image.cluster_context", lambda *a, **k: _Cluster())
    for old, new in (("--relay", "--star"), ("--forward", "--chain"), ("--star", None)):
        result = cli("image", "push", "-i", str(tmp_path / "inv.yaml"), old)
        assert result.exit_code == 0, result.stderr
        said = f"{old} is a deprecated alias of {new}"
        assert (said in result.stderr) == (new is not None), result.stderr
    assert [(o.star, o.chain) for o in seen] == [(True, False), (False, True), (True, False)]


class _Pin:
    def short_id(self) -> str:
        return "sha256:0"


class _Cluster:
    def require_pin(self) -> _Pin:
        return _Pin()
