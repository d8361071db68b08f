"""s3://bucket/prefix: the one reading every flag that takes an S3 location uses."""

from __future__ import annotations

import pytest

from clusterctl import s3uri
from clusterctl.s3uri import S3Uri


@pytest.mark.parametrize(
    "text, bucket, prefix",
    [
        ("s3://my-bucket", "my-bucket", ""),
        ("s3://my-bucket/", "my-bucket", ""),
        ("s3://my-bucket/imagenet", "my-bucket", "imagenet/"),  # a folder: never imagenet-private/...
        ("s3://my-bucket/imagenet/train/", "my-bucket", "imagenet/train/"),
        ("s3://b.with.dots/a//b/", "b.with.dots", "a//b/"),
        ("s3://my-bucket/my data/", "my-bucket", "my data/"),  # a key may hold a space
    ],
)
def test_a_location_is_a_bucket_and_a_folder(text, bucket, prefix):
    loc = s3uri.parse(text)
    assert loc == S3Uri(bucket, prefix)
    assert str(loc) == f"s3://{bucket}/{prefix}"
    assert s3uri.parse(str(loc)) == loc


@pytest.mark.parametrize(
    "text, why",
    [
        ("/tmp/x", "does not start with s3://"),
        ("my-bucket/x", "does not start with s3://"),
        ("s3://", "'' is not a bucket name"),
        ("s3://Bad_Bucket/x", "'Bad_Bucket' is not a bucket name"),
        ("s3://ab/x", "'ab' is not a bucket name"),
        ("s3://b-/x", "'b-' is not a bucket name"),
        ("s3://my-bucket/x/*", "no wildcards"),
        ("s3://my-bucket/x?", "no wildcards"),
        ("s3://my-bucket/x\n", "control characters"),
    ],
)
def test_anything_else_says_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=f"^{why}" if why.startswith("'") else why):
        s3uri.parse(text)


def test_the_scheme_may_be_left_out_where_a_flag_allows_it():
    assert s3uri.parse("my-bucket/imagenet", scheme_optional=True) == S3Uri("my-bucket", "imagenet/")
    assert s3uri.parse("s3://my-bucket/imagenet", scheme_optional=True) == S3Uri("my-bucket", "imagenet/")
