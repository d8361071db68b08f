"""The AWS provider's one way to AWS: clients, calls, the one-line errors, retries, waiters and paging.

botocore runs in standard retry mode (throttling and 5xx are retried with backoff, and a retried RunInstances
carries the same ClientToken, so a lost response never doubles the cluster). What botocore does not retry is
done here with clusterctl/retry.py's backoff, in one place (`_through`): a call about something this run just
created ("<Thing>.NotFound" while EC2 settles) and a delete that waits for a dependency to go.

boto3 and botocore are imported inside the functions: `clusterctl --help` never loads them.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping

from clusterctl.errors import ClusterctlError, ConfigError, ProvisionError
from clusterctl.retry import backoff

Report = Callable[[str], None]

LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
QUOTA_CODES = {"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "VolumeLimitExceeded"}
DEPENDENCY_CODES = {
    "DependencyViolation",
    "InvalidPlacementGroup.InUse",
    "DeleteConflict",
    "ResourceInUse",
    "InvalidNetworkInterface.InUse",
    "VolumeInUse",
}
NOT_FOUND = re.compile(r"(NotFound|NoSuchEntity|\.Malformed|InvalidPlacementGroup\.Unknown|InvalidKeyPair\.NotFound)")
_SETTLING = re.compile(r"^Invalid(Vpc|Subnet|Group|InternetGateway|RouteTable|PlacementGroup|KeyPair)(ID)?\.NotFound$")
SETTLE_WAIT = 60.0  # how long a just-created thing may stay invisible to the next call


def _no_report(_: str) -> None:
    pass


_SESSION: list[Any] = []  # the command's one boto3 Session, made on first use
_SESSION_LOCK = threading.Lock()  # a boto3 Session is not thread-safe; the clients made from it are


def session() -> Any:
    """The command's one boto3 Session. Every client of every region is made from it, so the credentials chain
    runs once: an assumed-role profile calls AssumeRole once and a profile with `mfa_serial` asks for its code
    once, whatever the services and regions the command uses (a Session per client would run it for each)."""
    with _SESSION_LOCK:
        if not _SESSION:
            import boto3

            _SESSION.append(_profile_checked(boto3.session.Session))
        return _SESSION[0]


def _profile_checked(make: Callable[[], Any]) -> Any:
    """make(), with botocore's ProfileNotFound (AWS_PROFILE or --profile naming no profile) said as a config error."""
    from botocore.exceptions import ProfileNotFound

    try:
        return make()
    except ProfileNotFound as exc:
        raise missing_profile(exc) from None


def missing_profile(exc: BaseException) -> ConfigError:
    """botocore's ProfileNotFound (AWS_PROFILE or --profile naming no profile), with the profiles there are."""
    import botocore.session

    try:
        have = sorted(botocore.session.Session(profile=None).available_profiles)
    except Exception:  # a config file too broken to list: say so below, without the list
        have = []
    named = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "?"
    there = f"the profiles there: {', '.join(have)}" if have else "there are none"
    return ConfigError(
        f"no AWS profile named {named!r} ({exc})",
        f"set AWS_PROFILE to a profile in ~/.aws/config or ~/.aws/credentials ({there}), or unset AWS_PROFILE",
    )


def configured_region() -> str | None:
    """The region the user configured, as the AWS CLI v2 and the other SDKs read it: AWS_REGION, then what
    boto3 itself reads (AWS_DEFAULT_REGION, then the profile's); None when there is none. boto3 alone
    ignores AWS_REGION, which users set, and the error's advice names."""
    return os.environ.get("AWS_REGION", "").strip() or _profile_checked(lambda: session().region_name) or None


def _tags(pairs: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"Key": k, "Value": v} for k, v in pairs.items()]


def _tagdict(resource: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", []) or []}


def _code(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "") if hasattr(exc, "response") else ""


def _message(exc: BaseException) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", "") if hasattr(exc, "response") else str(exc)


def _epoch(value: Any) -> float:
    if value is None:
        return time.time()
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time()


class Api:
    """The region's clients and the calls through them; `report` says what is being waited for."""

    def __init__(self, region: str | None = None, report: Report | None = None, poll_interval: float = 2.0):
        self._region = region or None
        self.report = report or _no_report
        self.poll_interval = poll_interval
        self._clients: dict[str, Any] = {}

    @property
    def region(self) -> str:
        if not self._region:
            self._region = configured_region()
            if not self._region:
                raise ConfigError(
                    "no AWS region given", "pass --region or set AWS_REGION (or a region in ~/.aws/config)"
                )
        return self._region

    @region.setter
    def region(self, value: str) -> None:
        if value != self._region:
            self._region = value
            self._clients.clear()  # clients are per region

    def client(self, service: str) -> Any:
        if service not in self._clients:
            from botocore.config import Config

            attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or 8)
            cfg = Config(
                retries={"mode": "standard", "total_max_attempts": max(1, attempts)},
                connect_timeout=10,
                read_timeout=60,
                user_agent_extra="clusterctl",
            )
            made, region = session(), self.region  # the region may ask the session: not under its lock
            with _SESSION_LOCK:
                self._clients[service] = _profile_checked(lambda: made.client(service, region_name=region, config=cfg))
        return self._clients[service]

    def call(self, service: str, op: str, **kwargs: Any) -> dict[str, Any]:
        """One API call; AWS errors stay ClientErrors (for the caller to judge), missing credentials are 3."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, NoRegionError, ProfileNotFound

        try:
            answer: dict[str, Any] = getattr(self.client(service), op)(**kwargs)
            return answer
        except NoCredentialsError:
            raise ConfigError(
                "no AWS credentials found",
                "configure them (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
            ) from None
        except NoRegionError:
            raise ConfigError("no AWS region given", "pass --region or set AWS_REGION") from None
        except ProfileNotFound as exc:
            raise missing_profile(exc) from None
        except ClientError:
            raise
        except BotoCoreError as exc:
            raise ProvisionError(f"AWS {op}: {exc}") from None

    def api(self, service: str, op: str, **kwargs: Any) -> dict[str, Any]:
        """Like call, but any AWS error is a ProvisionError naming the call."""
        from botocore.exceptions import ClientError

        try:
            return self.call(service, op, **kwargs)
        except ClientError as exc:
            raise self.error(op, exc) from None

    def error(self, op: str, exc: BaseException) -> ClusterctlError:
        code, msg = _code(exc), _message(exc)
        if code in (
            "AuthFailure",
            "UnauthorizedOperation",
            "AccessDenied",
            "AccessDeniedException",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
        ):
            return ProvisionError(f"AWS refused {op} ({code}): {msg}", "check the credentials' permissions")
        if code in QUOTA_CODES:
            return ProvisionError(
                f"AWS {op}: {code}: {msg}", "request a quota increase, or ask for fewer/smaller nodes"
            )
        if code in ("RequestLimitExceeded", "Throttling", "ThrottlingException"):
            return ProvisionError(f"AWS kept throttling {op} after retries ({code})", "wait a minute and run it again")
        return ProvisionError(f"AWS {op} failed: {code}: {msg}")

    def paginate(self, service: str, op: str, key: str, **kwargs: Any) -> list[dict[str, Any]]:
        from botocore.exceptions import ClientError

        out: list[dict[str, Any]] = []
        try:
            for page in self.client(service).get_paginator(op).paginate(**kwargs):
                out.extend(page.get(key, []))
        except ClientError as exc:
            raise self.error(op, exc) from None
        return out

    def _through(
        self,
        op: str,
        call: Callable[[], dict[str, Any]],
        waits_for: Callable[[str], bool],
        deadline: float,
        delays: Iterator[float],
        why: str,
    ) -> dict[str, Any]:
        """call() until it answers; an AWS error whose code `waits_for` accepts is waited through with the shared
        backoff until the deadline, any other (or one past the deadline) is raised as it came."""
        from botocore.exceptions import ClientError

        for delay in delays:
            try:
                return call()
            except ClientError as exc:
                if not waits_for(_code(exc)) or time.monotonic() > deadline:
                    raise
                self.report(f"{op}: {_code(exc)}{why} waiting {delay:.1f}s")
                time.sleep(delay)
        raise AssertionError("backoff() never ends")

    def settled(self, service: str, op: str, **kwargs: Any) -> dict[str, Any]:
        """A call about something this run just created: EC2 is eventually consistent, so "<Thing>.NotFound"
        right after the create is waited through (bounded), then it is an error like any other."""
        from botocore.exceptions import ClientError

        try:
            return self._through(
                op,
                lambda: self.call(service, op, **kwargs),
                lambda code: bool(_SETTLING.match(code)),
                time.monotonic() + SETTLE_WAIT,
                backoff(0.2, 5.0),
                " right after creating it;",
            )
        except ClientError as exc:
            raise self.error(op, exc) from None

    def delete(self, deadline: float, service: str, op: str, **kwargs: Any) -> bool:
        """One delete, retried through dependency errors until the deadline. Already gone counts as done
        (False: nothing was removed by this call); a dependency still there at the deadline is reported."""
        from botocore.exceptions import ClientError

        try:
            self._through(
                op,
                lambda: self.call(service, op, **kwargs),
                DEPENDENCY_CODES.__contains__,
                deadline,
                backoff(min(0.5, self.poll_interval), 10.0),
                ",",
            )
            return True
        except ClientError as exc:
            code = _code(exc)
            if NOT_FOUND.search(code) or code == "Gateway.NotAttached":
                return op.startswith("detach")
            if code in DEPENDENCY_CODES:
                self.report(f"gave up on {op} {kwargs}: {code}")
                return False
            raise self.error(op, exc) from None

    def wait_terminated(self, ids: list[str], deadline: float) -> None:
        """botocore's own `instance_terminated` waiter, polling every poll_interval until the deadline; a timeout
        is not an error here (the final listing names what is left), an AWS error is."""
        from botocore.exceptions import WaiterError

        self.report(f"waiting for {len(ids)} instance(s) to terminate")
        delay = max(0.01, self.poll_interval)
        waiter = self.client("ec2").get_waiter("instance_terminated")
        while True:
            attempts = max(1, int(max(0.0, deadline - time.monotonic()) / delay) + 1)
            try:
                waiter.wait(InstanceIds=ids, WaiterConfig={"Delay": delay, "MaxAttempts": attempts})
                return
            except WaiterError as exc:
                last = exc.last_response or {}
                if "Error" in last:
                    raise self.error("DescribeInstances", _Answer(last)) from None
                # The waiter gives up on a `pending` or `stopping` instance; right after TerminateInstances that is
                # EC2 not having settled yet, so the wait goes on until the deadline like any other.
                if "terminal failure state" not in str(exc) or time.monotonic() + delay > deadline:
                    return
                time.sleep(delay)


class _Answer(Exception):
    """A waiter's last answer that was an AWS error, in the shape _code and _message read."""

    def __init__(self, response: dict[str, Any]):
        super().__init__(response.get("Error", {}).get("Message", ""))
        self.response = response
