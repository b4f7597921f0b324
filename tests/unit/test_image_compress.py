"""The compressed push's pure parts: the codec a node gets, the rule that says whether to
compress, the compressor command lines, and the stream of compressed layer files (built
here from a real tar laid out as `docker save` lays it out, and read back with tarfile
and gzip, which are the references for the formats)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shlex
import tarfile
from pathlib import Path

import pytest

from provisioner.errors import OperationError
from provisioner.image.compress import (
    SMALL_BYTES,
    ZLIB_CHUNK,
    CacheRecord,
    Codec,
    Estimate,
    LayerCache,
    best_level,
    choose,
    compress_argv,
    compress_file,
    compress_range,
    compressed_stream,
    content_digest,
    node_reads,
    pick_codec,
    sender_cores,
    small_send,
    stream_zlib,
)
from provisioner.image.pin import Pin, Versions
from provisioner.image.savestream import read_saved
from provisioner.runtime.docker.direct import SavedCache, saved_problems
from provisioner.runtime.docker.push_plan import facts_script, parse_facts

PIN_BYTES = 1_892_815_123  # the pin's size
MBIT_50 = 50e6 / 8


def test_compressor_command_lines_are_multi_threaded_and_quoted() -> None:
    assert shlex.join(compress_argv(Codec("zstd", 3))) == "zstd -T0 -3 -q -c"
    assert shlex.join(compress_argv(Codec("pigz", 1))) == "pigz -1 -c"
    assert compress_argv(Codec("zlib", 1)) == []  # in-process, on every core


@pytest.mark.parametrize(
    ("engine", "reads"),
    [
        ("20.10.24+dfsg1 overlay2", ("gz",)),  # bookworm's Docker: zstd layers refused
        ("26.1.5+dfsg1 overlay2", ("zst", "gz")),
        ("26.1.5+dfsg1 overlayfs", ()),  # the containerd image store: blobs kept by digest
        ("", ()),  # unknown: plain
        ("garbage overlay2", ()),
    ],
)
def test_what_a_nodes_docker_load_reads_inside_a_layer(engine: str, reads: tuple[str, ...]) -> None:
    assert node_reads(engine) == reads


def test_the_codec_is_the_best_one_both_sides_have() -> None:
    assert pick_codec(("zstd", "zlib"), ("zst", "gz")) == Codec("zstd", 3)
    assert pick_codec(("zstd", "zlib"), ("gz",)) == Codec("zlib", 1)
    assert pick_codec(("pigz", "zlib"), ("gz",)) == Codec("pigz", 1)
    assert pick_codec(("zstd", "zlib"), ()) is None


def estimate(link: float, *, cpu: float = 13e6, uncached: int = PIN_BYTES) -> Estimate:
    return Estimate(link, cpu, 0.28, PIN_BYTES, uncached, decode_bps=100e6)


def test_a_slow_link_gets_compressed_layers_and_a_fast_one_plain() -> None:
    slow, why = choose("auto", estimate(MBIT_50))
    assert slow and "compressed ~" in why
    fast, _ = choose("auto", estimate(1e9 / 8))  # 125 MB/s: faster than the compressor
    assert not fast
    # cached layers cost no compression: compressed on the slow link...
    assert choose("auto", estimate(MBIT_50, uncached=0))[0]
    # ...and still plain where the node's decompression would be slower than the link
    assert not choose("auto", estimate(1e9 / 8, uncached=0))[0]


def test_a_send_of_a_few_megabytes_at_most_is_compressed_unmeasured_and_a_bigger_one_is_not() -> (
    None
):
    why = small_send(24 * 1024)  # a project's own layer after a one-line change
    assert why is not None and "25 kB" in why
    assert small_send(SMALL_BYTES) is not None
    assert small_send(SMALL_BYTES + 1) is None  # the link and the compressor decide


def test_the_mode_overrides_the_rule_and_no_estimate_means_plain() -> None:
    assert choose("never", estimate(MBIT_50)) == (False, "compression off")
    assert choose("always", estimate(1e9 / 8)) == (True, "compression forced")
    assert choose("auto", None)[0] is False


def test_the_push_facts_carry_the_engine_line() -> None:
    assert "{{.ServerVersion}} {{.Driver}}" in facts_script()
    facts = parse_facts("docker=ok\nroot=/var/lib/docker\nengine=20.10.24+dfsg1 overlay2\n")
    assert facts.engine == "20.10.24+dfsg1 overlay2"


def test_threaded_gzip_is_one_valid_gzip_stream(tmp_path: Path) -> None:
    data = (b"abcdefghijklmnop" * 4096) * (ZLIB_CHUNK // 65536 + 3)  # more than one member
    src = tmp_path / "data"
    src.write_bytes(b"head" + data)
    sink = io.BytesIO()
    compress_range(src, 4, len(data), Codec("zlib", 1), sink)
    assert gzip.decompress(sink.getvalue()) == data
    assert sink.getvalue().count(b"\x1f\x8b\x08") >= 2  # several members, in order


CONFIG = b'{"rootfs": "two layers"}'


def saved_tar(path: Path) -> list[bytes]:
    """A tar laid out as legacy `docker save` writes it: two layers and a manifest."""
    layers = [b"bottom layer " * 5000, b"top layer " * 7000]
    config = f"{hashlib.sha256(CONFIG).hexdigest()}.json"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [
            ("aaa/layer.tar", layers[0]),
            ("bbb/layer.tar", layers[1]),
            (config, CONFIG),
            (
                "manifest.json",
                json.dumps(
                    [{"Config": config, "Layers": ["aaa/layer.tar", "bbb/layer.tar"]}]
                ).encode(),
            ),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return layers


def diff_ids(layers: list[bytes]) -> tuple[str, ...]:
    return tuple("sha256:" + hashlib.sha256(layer).hexdigest() for layer in layers)


def read_stream(chunks: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(chunks), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_stream_is_the_saved_tar_with_each_sent_layer_gzipped_and_cached_once(
    tmp_path: Path,
) -> None:
    layers = saved_tar(tmp_path / "img.tar")
    saved = read_saved(tmp_path / "img.tar")
    ids = diff_ids(layers)
    cache, codec = LayerCache(tmp_path / "layers"), Codec("zlib", 1)
    first = CacheRecord()
    out = read_stream(b"".join(compressed_stream(saved, ids, 0, codec, cache, first)))
    assert gzip.decompress(out["aaa/layer.tar"]) == layers[0]
    assert gzip.decompress(out["bbb/layer.tar"]) == layers[1]
    assert len(out["bbb/layer.tar"]) < len(layers[1]) / 10
    config = f"{hashlib.sha256(CONFIG).hexdigest()}.json"
    assert out[config] == CONFIG and b"bbb/layer.tar" in out["manifest.json"]
    assert (first.hits, first.misses) == ([], list(ids))  # positive control: compressed now
    again, omitted = CacheRecord(), list[int]()
    partial = b"".join(compressed_stream(saved, ids, 1, codec, cache, again, omitted.append))
    out = read_stream(partial)
    assert "aaa/layer.tar" not in out and gzip.decompress(out["bbb/layer.tar"]) == layers[1]
    assert omitted == [len(layers[0])]
    assert (again.hits, again.misses) == ([ids[1]], [])  # from the cache: nothing compressed
    events = [
        json.loads(x)["event"] for x in (tmp_path / "layers/record.jsonl").read_text().splitlines()
    ]
    assert events == ["miss", "miss", "hit"]


def test_a_compressed_layer_is_cached_only_when_it_holds_its_diff_ids_content(
    tmp_path: Path,
) -> None:
    """A layer read from a saved file that went bad (here: named by another diff ID) is
    refused when its entry is written, not cached under the name for every later push."""
    layers = saved_tar(tmp_path / "img.tar")
    saved = read_saved(tmp_path / "img.tar")
    top = next(m for m in saved.members if m.name == "bbb/layer.tar")
    cache, codec = LayerCache(tmp_path / "layers"), Codec("zlib", 1)
    wrong = diff_ids([b"another layer"])[0]
    with pytest.raises(OperationError, match="not that layer") as refused:
        cache.get(saved, top, wrong, codec, CacheRecord())
    assert "push again" in (refused.value.fix or "")
    assert sorted(p.name for p in (tmp_path / "layers").iterdir()) == []  # nor a .partial
    right = diff_ids(layers)[1]  # the positive control: the layer's own diff ID is cached
    entry = cache.get(saved, top, right, codec, CacheRecord())
    assert entry == cache.path(right, codec) and gzip.decompress(entry.read_bytes()) == layers[1]


def test_a_corrupt_compressed_layer_is_dropped_and_made_anew_and_a_good_one_kept(
    tmp_path: Path,
) -> None:
    layers = saved_tar(tmp_path / "img.tar")
    saved = read_saved(tmp_path / "img.tar")
    ids = diff_ids(layers)
    cache, codec = LayerCache(tmp_path / "layers"), Codec("zlib", 1)
    b"".join(compressed_stream(saved, ids, 0, codec, cache, CacheRecord()))
    good, bad = cache.path(ids[0], codec), cache.path(ids[1], codec)
    kept = good.read_bytes()
    bad.write_bytes(gzip.compress(b"not the top layer"))  # a whole gzip stream, wrong content
    assert cache.drop_bad(list(ids), codec) == [ids[1]]
    assert not bad.exists() and good.read_bytes() == kept
    again = CacheRecord()
    out = read_stream(b"".join(compressed_stream(saved, ids, 0, codec, cache, again)))
    assert gzip.decompress(out["bbb/layer.tar"]) == layers[1]
    assert (again.hits, again.misses) == ([ids[0]], [ids[1]])
    bad.write_bytes(bad.read_bytes()[:-20])  # cut short: not a whole gzip stream
    assert cache.drop_bad([ids[1]], codec) == [ids[1]] and not bad.exists()
    events = [
        json.loads(x)["event"] for x in (tmp_path / "layers/record.jsonl").read_text().splitlines()
    ]
    assert events == ["miss", "miss", "dropped", "hit", "miss", "dropped"]


def saved_pin(layers: list[bytes]) -> Pin:
    return Pin(
        image_id="sha256:" + hashlib.sha256(CONFIG).hexdigest(),
        layers=diff_ids(layers),
        base_image="base",
        base_image_id="sha256:" + "3" * 64,
        requirements_sha256="4" * 64,
        versions=Versions(python="3.11", ray="2.60.0", torch="2.13.0", gymnasium="1.0"),
        size=1 << 20,
    )


def test_a_saved_image_whose_layer_went_bad_is_dropped_after_a_rejected_load(
    tmp_path: Path,
) -> None:
    """The saved-image cache (`<pin id>.tar`): a file whose layer no longer hashes to its
    diff ID is removed once a load rejected what was sent from it, so the next attempt
    saves it anew; a good one is kept (the positive control)."""
    layers = saved_tar(tmp_path / "img.tar")
    pin = saved_pin(layers)
    cache_dir = tmp_path / "images"
    cache_dir.mkdir()
    path = cache_dir / f"{pin.image_id.removeprefix('sha256:')}.tar"
    (tmp_path / "img.tar").rename(path)
    good = SavedCache(pin, cache_dir)
    assert saved_problems(good.get(print), pin.layers) == []
    assert good.reject(CacheRecord(), None) == [] and path.is_file()
    top = next(m for m in read_saved(path).members if m.name == "bbb/layer.tar")
    with path.open("r+b") as f:  # one byte of the top layer flipped on disk
        f.seek(top.offset_data + 100)
        f.write(b"X")
    assert saved_problems(read_saved(path), pin.layers) == [
        f"layer {pin.layers[1][:19]}, not its content"
    ]
    bad = SavedCache(pin, cache_dir)
    bad.get(print)  # trusted by its name and config until a load rejects it
    dropped = bad.reject(CacheRecord(), None)
    assert len(dropped) == 1 and path.name in dropped[0] and not path.exists()


def test_gzip_of_a_pipe_read_to_its_end_is_one_valid_gzip_stream() -> None:
    """The cold push's zlib fallback reads `docker save` to its end (no size known): a
    source that returns short reads, as a pipe does, still gives every byte once."""
    data = bytes(range(256)) * (ZLIB_CHUNK // 256 + 5000)

    class Pipe(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:  # at most 64 KiB a read, as a pipe
            return super().read(min(n if n is not None and n >= 0 else 1 << 16, 1 << 16))

    sink = io.BytesIO()
    assert stream_zlib(Pipe(data), 1, sink) == len(data)
    assert gzip.decompress(sink.getvalue()) == data


def test_the_sender_keeps_a_core_for_ssh_and_docker_save() -> None:
    assert (sender_cores(1), sender_cores(2), sender_cores(16)) == (1, 1, 15)
    assert compress_argv(Codec("zstd", 9), threads=1) == ["zstd", "-T1", "-9", "-q", "-c"]
    assert compress_argv(Codec("pigz", 1), threads=1) == ["pigz", "-p", "1", "-1", "-c"]


def layer_like(n: int) -> bytes:
    """Bytes that compress as the pin's layers do: Python's own sources (the pin is
    mostly Python packages)."""
    files = sorted(Path(os.__file__).parent.rglob("*.py"))
    return b"".join(p.read_bytes() for p in files)[:n]


def test_a_cold_push_over_a_slow_link_takes_the_denser_zstd_level_and_a_fast_one_the_faster() -> (
    None
):
    data = layer_like(8 << 20)
    zstd = Codec("zstd", 3)
    slow, slow_est = best_level(data, zstd, 1e6, PIN_BYTES, 1)  # 8 Mbit/s
    assert slow == Codec("zstd", 9)  # the link, not the CPU, bounds it: fewer bytes win
    fast, fast_est = best_level(data, zstd, 10e9, PIN_BYTES, 1)
    assert fast == zstd  # the compressor bounds it: the faster level wins
    assert slow_est.ratio < fast_est.ratio  # positive control: -9 is the denser
    # pigz and zlib have one level
    assert best_level(data, Codec("zlib", 1), MBIT_50, PIN_BYTES, 1)[0] == Codec("zlib", 1)


def test_a_whole_zstd_file_is_read_to_its_end_and_its_digest_taken_every_time(
    tmp_path: Path,
) -> None:
    """The checker reads zstd's output to its end and then waits for zstd's own exit: one
    that killed zstd once its output ended (before zstd had exited) refused good files at
    random, a 24 kB layer among them (seen in the project push on the lab)."""
    for size in (0, 24 * 1024, 3 << 20):
        data = os.urandom(size // 2) + bytes(size - size // 2)
        path = tmp_path / f"{size}.zst"
        with path.open("wb") as sink:
            compress_file(io.BytesIO(data), size, Codec("zstd", 3), sink)
        want = "sha256:" + hashlib.sha256(data).hexdigest()
        for _ in range(30):
            assert content_digest(path, "zst") == want
    cut = tmp_path / "cut.zst"  # positive control: a stream cut short is still refused
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(OperationError, match="not a whole zstd stream"):
        content_digest(cut, "zst")
