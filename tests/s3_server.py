"""A real S3-compatible server on a free loopback port for the ``s3://`` model-source
tests: moto's standalone server (``python -m moto.server``) in its own process, so a
Ray replica in another process reaches it like any S3 endpoint. moto accepts any
credentials; the tests use fixed dummy ones."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.local_redis import free_port, stop_process

START_TIMEOUT_S = 30.0
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "switchyard-test-key",
    "AWS_SECRET_ACCESS_KEY": "switchyard-test-secret-never-logged",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/moto-api/", timeout=1.0):
            return True
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def s3_server(workdir: Path) -> Iterator[str]:
    """Start the server (log in ``workdir``) and yield ``http://127.0.0.1:PORT``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (workdir / "moto.log").open("wb") as log:
        args = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline and not _answers(url):
                time.sleep(0.1)
            if not _answers(url):
                raise RuntimeError(f"moto's S3 server did not start; see {workdir / 'moto.log'}")
            yield url
        finally:
            stop_process(proc)


def client(endpoint: str) -> Any:
    import boto3

    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    ).client("s3", endpoint_url=endpoint)


def upload_folder(
    endpoint: str, folder: Path, bucket: str, prefix: str, *, sha256: bool = False
) -> int:
    """Upload every file under ``folder`` to ``s3://bucket/prefix/…``; returns the count.
    ``sha256`` uploads with a full-object SHA-256 checksum (else the ETag is the MD5)."""
    s3 = client(endpoint)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)
    extra = {"ChecksumAlgorithm": "SHA256"} if sha256 else {}
    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    for path in files:
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), **extra)
    return len(files)
