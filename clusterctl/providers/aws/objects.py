"""S3 as the contract's ObjectStore (providers/base.py): the runtime cache's reads and presigned URLs."""

from __future__ import annotations

from typing import Any

from clusterctl.errors import ProvisionError
from clusterctl.providers.base import ObjectStore

_ABSENT = ("404", "NoSuchKey", "NotFound")
_HOUR = 3600


class S3Objects(ObjectStore):
    def __init__(self, client: Any) -> None:
        self.client = client

    def exists(self, bucket: str, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _ABSENT:
                return False
            raise ProvisionError(str(exc)) from None

    def presigned_get(self, bucket: str, key: str) -> str:
        url: str = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_HOUR
        )
        return url

    def presigned_put(self, bucket: str, key: str) -> str:
        url: str = self.client.generate_presigned_url(
            "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=_HOUR
        )
        return url
