"""s3://bucket/prefix, read one way for every flag that takes one (--s3-read, --checkpoint-to,
--runtime-cache, the SRC of `sync` and `data tfrecords`): they agree on what a bucket name is, and a prefix
is a folder (s3://b/imagenet is b/imagenet/..., never b/imagenet-private/...). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str  # "" (the whole bucket) or a folder: "imagenet/train/"

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse(text: str, *, scheme_optional: bool = False) -> S3Uri:
    """The bucket and folder of s3://bucket[/prefix] (of bucket[/prefix] too with scheme_optional);
    ValueError saying what is wrong otherwise. Wildcards and control characters are refused: a location
    here is a folder, never a pattern."""
    if text.startswith("s3://"):
        rest = text[len("s3://") :]
    elif scheme_optional:
        rest = text
    else:
        raise ValueError("it does not start with s3://")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise ValueError(f"{bucket!r} is not a bucket name")
    if any(c in "*?" or ord(c) < 32 or ord(c) == 127 for c in prefix):
        raise ValueError("a prefix is a folder: no wildcards or control characters")
    prefix = prefix.strip("/")
    return S3Uri(bucket, prefix + "/" if prefix else "")
