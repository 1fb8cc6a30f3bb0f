"""s3:// model sources against a real S3-compatible server (moto's, on 127.0.0.1):
download once per node into the cache, checksums, progress, locking, failures."""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
from pathlib import Path

import pytest

from app.models.s3 import (
    FetchProgress,
    S3Location,
    S3SourceError,
    check_object,
    fetch_model,
)
from app.models.store import MANIFEST_NAME, Manifest
from tests.s3_server import CREDENTIALS, client, upload_folder


def make_model(root: Path, size: int = 40_000) -> Path:
    """A folder shaped like an HF model (contents do not matter here)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "llama"}\n')
    (root / "weights.bin").write_bytes(bytes(range(256)) * (size // 256))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("a\nb\nc\n")
    (root / MANIFEST_NAME).write_text("{}")  # an uploader's own: left out of the cache
    return root


def same_files(a: Path, b: Path) -> bool:
    def listing(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and p.name != MANIFEST_NAME
        }

    return listing(a) == listing(b)


@pytest.fixture
def bucket(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    name = "m-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]
    client(s3_endpoint).create_bucket(Bucket=name)
    return name


# ---- URLs and cache places ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [
        ("s3://models/llama", "models", "llama"),
        ("s3://models/team/llama-8b/", "models", "team/llama-8b"),
    ],
)
def test_parse_takes_bucket_and_prefix(url: str, bucket: str, prefix: str) -> None:
    location = S3Location.parse(url)
    assert (location.bucket, location.prefix) == (bucket, prefix)
    assert location.url == f"s3://{bucket}/{prefix}"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://models/llama", "not an s3:// URL"),
        ("s3://models", "s3://BUCKET/PREFIX"),
        ("s3:///llama", "s3://BUCKET/PREFIX"),
        ("s3://models/a/../b", "'..'"),
        ("s3://models/a//b", "empty"),
    ],
)
def test_parse_refuses_what_names_no_folder(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        S3Location.parse(url)


def test_cache_dir_is_per_url_and_endpoint(tmp_path: Path) -> None:
    a = S3Location.parse("s3://models/llama").cache_dir(tmp_path)
    b = S3Location.parse("s3://models/llama2").cache_dir(tmp_path)
    c = S3Location.parse("s3://models/llama", "http://127.0.0.1:9000").cache_dir(tmp_path)
    assert len({a, b, c}) == 3
    assert a.parent == tmp_path / "s3" and a.name.startswith("llama-")


# ---- one object's check ------------------------------------------------------------------


def _b64sha(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


DATA = b"switchyard weights"
MD5 = hashlib.md5(DATA).hexdigest()


@pytest.mark.parametrize(
    ("size", "etag", "sha", "expected"),
    [
        (len(DATA), f'"{MD5}"', _b64sha(DATA), "sha256"),
        (len(DATA), f'"{MD5}"', None, "md5"),
        (len(DATA), '"0123456789abcdef0123456789abcdef-3"', None, "size"),  # multipart
        (len(DATA), '"0123456789abcdef0123456789abcdef-3"', "AAAA-3", "size"),
        (len(DATA), f'"{MD5}"', "AAAA-3", "md5"),  # multipart checksum: fall to ETag
        (len(DATA) + 1, f'"{MD5}"', None, "bytes on disk"),
        (len(DATA), '"00000000000000000000000000000000"', None, "MD5"),
        (len(DATA), f'"{MD5}"', _b64sha(b"other"), "SHA-256"),
    ],
)
def test_check_object(tmp_path: Path, size: int, etag: str, sha: str | None, expected: str) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    if expected in ("sha256", "md5", "size"):
        assert check_object(path, size, etag, sha) == expected
    else:
        with pytest.raises(S3SourceError, match=expected):
            check_object(path, size, etag, sha)


# ---- fetching from the server --------------------------------------------------------------


@pytest.mark.parametrize("sha256", [False, True])
def test_fetch_downloads_once_and_checks_every_file(
    s3_endpoint: str, bucket: str, tmp_path: Path, sha256: bool
) -> None:
    model = make_model(tmp_path / "model")
    assert upload_folder(s3_endpoint, model, bucket, "llama", sha256=sha256) == 4
    location = S3Location.parse(f"s3://{bucket}/llama", s3_endpoint)
    dest = location.cache_dir(tmp_path / "cache")
    events: list[FetchProgress] = []

    assert fetch_model(location, dest, progress=events.append, progress_every_s=0) is True
    assert same_files(model, dest)
    manifest = Manifest.from_json((dest / MANIFEST_NAME).read_text())
    assert manifest is not None and manifest.name == location.url
    kind = "sha256" if sha256 else "md5"
    assert manifest.converter == {"checked": repr([(kind, 3)])}
    total = sum(
        p.stat().st_size for p in model.rglob("*") if p.is_file() and p.name != MANIFEST_NAME
    )
    assert events[-1] == FetchProgress(location.url, total, total)
    assert [e.done for e in events] == sorted(e.done for e in events)

    events.clear()
    assert fetch_model(location, dest, progress=events.append) is False  # on this node
    assert events == []


def test_a_damaged_cache_is_fetched_again(s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    model = make_model(tmp_path / "model")
    upload_folder(s3_endpoint, model, bucket, "llama")
    location = S3Location.parse(f"s3://{bucket}/llama", s3_endpoint)
    dest = location.cache_dir(tmp_path / "cache")
    fetch_model(location, dest)
    (dest / "weights.bin").write_bytes(b"truncated")
    assert fetch_model(location, dest) is True
    assert same_files(model, dest)
    # A same-size corruption passes the cheap check; verify=True re-hashes.
    data = bytearray((dest / "weights.bin").read_bytes())
    data[0] ^= 0xFF
    (dest / "weights.bin").write_bytes(bytes(data))
    assert fetch_model(location, dest) is False
    assert fetch_model(location, dest, verify=True) is True
    assert same_files(model, dest)


def test_replicas_on_one_node_download_once(s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    upload_folder(s3_endpoint, make_model(tmp_path / "model", 400_000), bucket, "llama")
    location = S3Location.parse(f"s3://{bucket}/llama", s3_endpoint)
    dest = location.cache_dir(tmp_path / "cache")
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch_model(location, dest)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]


@pytest.mark.parametrize(
    ("url", "upload", "says"),
    [
        ("s3://{bucket}/absent", False, "no config.json"),
        ("s3://{bucket}/nohf", True, "no config.json"),
        ("s3://no-such-bucket-here/llama", False, "cannot list the objects"),
    ],
)
def test_fetch_failures_publish_nothing_and_hide_the_secret(
    s3_endpoint: str,
    bucket: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    url: str,
    upload: bool,
    says: str,
) -> None:
    if upload:
        (tmp_path / "nohf").mkdir()
        (tmp_path / "nohf" / "weights.bin").write_bytes(b"x")
        upload_folder(s3_endpoint, tmp_path / "nohf", bucket, "nohf")
    location = S3Location.parse(url.format(bucket=bucket), s3_endpoint)
    dest = location.cache_dir(tmp_path / "cache")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(S3SourceError, match=says) as info:
        fetch_model(location, dest)
    assert not dest.exists()
    secret = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    assert secret not in str(info.value)
    assert secret not in caplog.text
