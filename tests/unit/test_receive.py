"""Files coming home (provisioner.remote.receive), tried with crafted hostile archives.

Each archive is refused with a clear ReceiveError, and afterwards nothing exists outside
the target: the test directory holds exactly what it held before (no file written
elsewhere, no destination, no leftover staging directory).
"""

from __future__ import annotations

import base64
import gzip
import io
import os
import stat
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from provisioner.cluster.logs import receive_logs
from provisioner.errors import ReceiveError
from provisioner.remote.receive import Limits, Receiver, check_name, pax_bounds, receive_tar

SMALL = Limits(members=50, file_bytes=1 << 20, total_bytes=2 << 20, compressed_bytes=1 << 20)

Add = Callable[[tarfile.TarFile], None]


def tar_of(*adds: Add, gz: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gz else "w", format=tarfile.GNU_FORMAT) as t:
        for add in adds:
            add(t)
    return buffer.getvalue()


def file(name: str, data: bytes = b"x", mode: int = 0o644) -> Add:
    def add(t: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        t.addfile(info, io.BytesIO(data))

    return add


def special(name: str, kind: bytes, linkname: str = "", mode: int = 0o755) -> Add:
    def add(t: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = kind, linkname, mode
        t.addfile(info)

    return add


def directory(name: str, mode: int = 0o777) -> Add:
    return special(name, tarfile.DIRTYPE, mode=mode)


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def refused(tmp_path: Path, data: bytes, match: str, limits: Limits = SMALL) -> ReceiveError:
    (tmp_path / "home").mkdir(parents=True)
    (tmp_path / "home" / ".bashrc").write_text("mine\n")
    before = snapshot(tmp_path)
    with pytest.raises(ReceiveError, match=match) as caught:
        receive_tar(data, tmp_path / "home" / "dest", limits=limits, what="results", where="job j")
    assert snapshot(tmp_path) == before  # nothing written anywhere, no staging left
    assert (tmp_path / "home" / ".bashrc").read_text() == "mine\n"
    assert caught.value.fix and caught.value.where == "job j"
    return caught.value


def test_a_plain_archive_lands_with_private_modes_whatever_the_tar_says(tmp_path: Path) -> None:
    data = tar_of(
        directory(".", 0o777),
        directory("./ckpt", 0o777),
        file("./ckpt/state.pkl", b"\x00" * 1000, 0o4777),
        file("metrics.csv", b"a,b\n1,2\n", 0o666),
    )
    got = receive_tar(data, tmp_path / "r" / "job", limits=SMALL, what="results", where="job j")
    assert got.directory == tmp_path / "r" / "job"
    assert [p.relative_to(got.directory).as_posix() for p in got.files] == [
        "ckpt/state.pkl",
        "metrics.csv",
    ]
    assert (got.directory / "metrics.csv").read_bytes() == b"a,b\n1,2\n"
    assert got.total_bytes == 1008
    modes = {
        p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in (tmp_path / "r").rglob("*")
    }
    assert modes == {
        "r/job": 0o700,
        "r/job/ckpt": 0o700,
        "r/job/ckpt/state.pkl": 0o600,
        "r/job/metrics.csv": 0o600,
    }


def test_long_name_symlink_chain_is_refused(tmp_path: Path) -> None:
    # The CVE-2025-4517 shape: directories with names near NAME_MAX, a chain of symlinks
    # through them whose textual path stays inside while the real one climbs out, then a
    # file written through the chain. tarfile's "data" filter passed it on 3.11.7.
    long = "d" * 247
    chain: list[Add] = []
    path = ""
    for step in "abcdefghijklmnop":
        chain += [directory(path + long), special(path + step, tarfile.SYMTYPE, long)]
        path += step + "/"
    chain += [
        special(path + "l" * 254, tarfile.SYMTYPE, "../" * len("abcdefghijklmnop")),
        special("escape", tarfile.SYMTYPE, path + "l" * 254 + "/../../../../.."),
        file("escape/home/.bashrc", b"echo pwned\n"),
    ]
    error = refused(tmp_path, tar_of(*chain), "'a' is a symbolic link")
    assert "nothing was written" in (error.fix or "")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../escape.txt", "climbs out"),
        ("a/../../escape.txt", "climbs out"),
        ("/tmp/escape.txt", "is absolute"),
        ("ok/\x1b]0;title\x07", "control characters"),
        ("x" * 300, "longer than 255"),
    ],
)
def test_names_that_leave_or_trick_are_refused(tmp_path: Path, name: str, why: str) -> None:
    refused(tmp_path, tar_of(file("fine.txt"), file(name)), why)
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/escape.txt").exists()


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (special("h", tarfile.LNKTYPE, "../../home/.bashrc"), "hard link"),
        (special("h", tarfile.LNKTYPE, "fine.txt"), "hard link"),
        (special("dev", tarfile.CHRTYPE), "a device"),
        (special("disk", tarfile.BLKTYPE), "a device"),
        (special("pipe", tarfile.FIFOTYPE), "a FIFO"),
        (special("link", tarfile.SYMTYPE, "/etc/passwd"), "symbolic link"),
    ],
)
def test_links_and_special_files_are_refused(tmp_path: Path, member: Add, why: str) -> None:
    refused(tmp_path, tar_of(file("fine.txt"), member), why)


def test_a_gzip_bomb_is_refused_before_it_fills_the_disk(tmp_path: Path) -> None:
    bomb = tar_of(file("zeros", b"\0" * (64 << 20)))  # 64 MiB of zeros
    assert len(bomb) < 128 << 10  # about 1000:1
    refused(tmp_path, bomb, "over 1048576 bytes")
    # the same bomb cut into files each under the per-file limit: the total stops it
    many = tar_of(*(file(f"z{i}", b"\0" * (900 << 10)) for i in range(40)))
    refused(tmp_path / "t2", many, "in all")


def test_compressed_size_and_member_count_are_bounded(tmp_path: Path) -> None:
    few = Limits(members=5, file_bytes=1 << 20, total_bytes=1 << 20, compressed_bytes=1 << 20)
    refused(tmp_path, tar_of(*(file(f"f{i}") for i in range(6))), "more than 5 files", few)
    noisy = tar_of(file("random", os.urandom(300_000)))
    tight = Limits(members=5, file_bytes=1 << 20, total_bytes=1 << 20, compressed_bytes=100_000)
    refused(tmp_path / "t2", noisy, "more than 100000 bytes compressed", tight)


def test_a_stream_of_headers_is_bounded_even_with_empty_files(tmp_path: Path) -> None:
    # long GNU names cost a member nothing in file bytes; the uncompressed bound holds
    names = tar_of(file("n" * 9000, b""))
    tight = Limits(members=2, file_bytes=10, total_bytes=10, compressed_bytes=1 << 20)
    refused(tmp_path, names, "once uncompressed", tight)


def test_duplicates_and_file_directory_clashes_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, tar_of(file("a"), file("a", b"second")), "comes twice")
    refused(tmp_path / "t2", tar_of(file("a"), file("a/b")), "both a file and a directory")


def test_garbage_and_truncated_archives_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, b"not a tar at all", "not a valid archive")
    good = tar_of(file("a", os.urandom(5000)))
    refused(tmp_path / "t2", good[: len(good) // 2], "not a valid archive")


def test_an_existing_destination_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "old").write_text("keep")
    with pytest.raises(ReceiveError, match="cannot put results"):
        receive_tar(
            tar_of(file("old", b"new")), tmp_path / "dest", limits=SMALL, what="results", where="n"
        )
    assert (tmp_path / "dest" / "old").read_text() == "keep"
    assert snapshot(tmp_path) == {"dest", "dest/old"}


def test_receiver_writes_fetched_files_with_their_digest(tmp_path: Path) -> None:
    with Receiver(tmp_path / "out", limits=SMALL, what="results", where="head") as r:
        r.add_directory("ckpt")
        got = r.add_file("ckpt/a.bin", [b"hello ", b"world"])
        assert got.size == 11
        assert got.sha256 == "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        with pytest.raises(ReceiveError, match="over 1048576 bytes"):
            r.add_file("big", iter([b"\0" * (1 << 19)] * 3))
        received = r.commit()
    assert received.files == [tmp_path / "out" / "ckpt" / "a.bin"]
    assert snapshot(tmp_path) == {"out", "out/ckpt", "out/ckpt/a.bin"}


def test_receiver_without_commit_leaves_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError),
        Receiver(tmp_path / "out", limits=SMALL, what="r", where="n") as r,
    ):
        r.add_file("a", [b"x"])
        raise RuntimeError("transport broke")
    assert snapshot(tmp_path) == set()


def test_check_name_keeps_safe_parts() -> None:
    assert check_name("./a//b/./c") == ("a", "b", "c")
    assert check_name(".") == ()
    with pytest.raises(ReceiveError, match="UTF-8"):
        check_name("bad\udcff")


def test_logs_from_a_node_go_through_the_same_rules(tmp_path: Path) -> None:
    hostile = base64.b64encode(tar_of(file("ray/raylet.out"), special("x", tarfile.SYMTYPE, "/")))
    with pytest.raises(ReceiveError, match="symbolic link") as caught:
        receive_logs(hostile.decode(), tmp_path / "node-1", "node-1")
    assert caught.value.where == "node-1"
    with pytest.raises(ReceiveError, match="not base64"):
        receive_logs("@@@ not base64", tmp_path / "node-1", "node-1")
    receive_logs("", tmp_path / "node-2", "node-2")
    good = base64.b64encode(tar_of(directory("."), file("./ray/raylet.out", b"Errno 98\n")))
    receive_logs(good.decode(), tmp_path / "node-3", "node-3")
    assert snapshot(tmp_path) == {"node-2", "node-3", "node-3/ray", "node-3/ray/raylet.out"}


def test_plain_tar_is_accepted_when_asked(tmp_path: Path) -> None:
    data = tar_of(file("a", b"1"), gz=False)
    receive_tar(data, tmp_path / "d", limits=SMALL, what="r", where="n", gzipped=False)
    assert (tmp_path / "d" / "a").read_bytes() == b"1"
    assert gzip.compress(data)[:2] == b"\x1f\x8b"


def pax_tar(*members: tuple[str, dict[str, str]], kind: bytes = tarfile.XHDTYPE) -> bytes:
    """A gzipped pax archive of one-byte files, each with the pax records given."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
        for name, records in members:
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 1, records
            if kind == tarfile.XGLTYPE:  # a global header of its own before the member
                t.fileobj.write(info.create_pax_global_header(records))
                info.pax_headers = {}
            t.addfile(info, io.BytesIO(b"x"))
    return buffer.getvalue()


def test_a_pax_header_that_triggers_cve_2024_6232_is_refused_before_it_is_parsed(
    tmp_path: Path,
) -> None:
    # The slow path: Python < 3.11.10 searches the header for `\d+ hdrcharset=` with
    # backtracking, quadratic in a run of digits (80 KB of them: 20 s on 3.11.7, unguarded).
    data = pax_tar(("a", {"comment": "1" * 80_000}))
    error = refused(tmp_path, data, "pax header of 80")
    assert "CVE-2024-6232" in error.message and "before it was parsed" in error.message
    # the same header, small: parsed, and the file lands (positive control)
    receive_tar(pax_tar(("a", {"comment": "1" * 100})), tmp_path / "ok", limits=SMALL,
                what="r", where="n")  # fmt: skip
    assert (tmp_path / "ok" / "a").read_bytes() == b"x"


def test_many_pax_headers_and_chains_of_them_are_bounded(tmp_path: Path) -> None:
    one, total = pax_bounds(sys.version_info[:3])
    if total < 1 << 40:  # a Python with the CVE: the archive's pax bytes in all are bounded
        each = {"comment": "1" * (one - 100)}
        data = pax_tar(*((f"f{i}", each) for i in range(total // (one - 100) + 2)))
        many = Limits(members=10_000, file_bytes=1 << 20, total_bytes=4 << 20,
                      compressed_bytes=1 << 20)  # fmt: skip
        refused(tmp_path / "a", data, "pax headers of .* bytes in all", many)
    # headers that describe the next one, in a row: each would be a recursion in tarfile
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
        for _ in range(3000):
            t.fileobj.write(tarfile.TarInfo("g").create_pax_global_header({"c": "1"}))
        info = tarfile.TarInfo("f")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    refused(tmp_path / "b", buffer.getvalue(), "extended headers in a row")
    got = receive_tar(pax_tar(("f", {"c": "1"}), kind=tarfile.XGLTYPE), tmp_path / "c",
                      limits=SMALL, what="r", where="n")  # fmt: skip
    assert [p.name for p in got.files] == ["f"]  # one global header, then a file: fine


def test_the_pax_bounds_follow_the_python_version() -> None:
    slow = pax_bounds((3, 11, 7))
    assert slow == pax_bounds((3, 11, 9)) == pax_bounds((3, 12, 5))
    fixed = pax_bounds((3, 11, 10))
    assert fixed == pax_bounds((3, 12, 6)) == pax_bounds((3, 13, 0))
    assert slow[0] < fixed[0] and slow[1] < fixed[1]
