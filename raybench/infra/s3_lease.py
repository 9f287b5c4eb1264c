"""The lock of an s3:// run folder: a lease object `<prefix>/.raybench-lock.json` (raybench.infra.run_lock).

No process on another machine can be checked, so the lease is written with a conditional put (If-None-Match:
only if absent), refreshed while the run works and taken over only once expired (If-Match: only if unchanged).
Expiry is judged by the store's clock, never a local one: a machine whose clock runs ahead would take over a live
lease. The holder re-checks the lease before every upload (raybench.infra.storage.sync_up calls `check_lease`), so
a holder that slept past its lease and lost it stops instead of writing beside the new holder.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
from typing import Any

from raybench.core.errors import RaybenchError
from raybench.infra.lock_holder import LOCK_NAME, holder_record, refusal

LEASE_S = 120.0  # an s3 lease not refreshed for this long (by the store's clock) is stale
REFRESH_S = 30.0

log = logging.getLogger(__name__)


class LeaseLost(RaybenchError, RuntimeError):
    """This process no longer holds the s3:// run's lease: another run may write there, so it stops uploading."""


def _lost(uri: str, why: str) -> LeaseLost:
    return LeaseLost(f"lost the lease on {uri} ({why}): another run may be writing there, so this one stops before "
                     f"uploading anything more. The lease object {uri.rstrip('/')}/{LOCK_NAME} names who holds it; "
                     "once that run is done, run again: finished work is kept")


def _store_age(resp: dict[str, Any]) -> float | None:
    """Seconds since the object was last written, by the store's own clock: its response's Date header minus the
    object's LastModified (both from the store, so a skewed local clock does not matter); None if either lacks."""
    from email.utils import parsedate_to_datetime

    modified = resp.get("LastModified")
    date = (resp.get("ResponseMetadata", {}).get("HTTPHeaders") or {}).get("date")
    if not isinstance(modified, datetime.datetime) or not date:
        return None
    try:
        now = parsedate_to_datetime(date)
    except (TypeError, ValueError):
        return None
    return (now - modified).total_seconds()


_leases: dict[str, S3Lease] = {}  # s3 run prefix -> the lease this process holds on it
_adopted: dict[str, str] = {}  # s3 run prefix -> holder token a driver handed to this worker process


class S3Lease:
    """`<prefix>/.raybench-lock.json`, written only if absent (or unchanged, to refresh/take over).

    Expiry is judged by the store's clock alone (`_store_age`: the lease object's LastModified against the Date of
    the store's reply), never by a local clock, which may be skewed. The holder refreshes the lease in a thread and
    re-checks it before every upload (`check`): once it is taken over or deleted, uploads stop (LeaseLost)."""

    def __init__(self, uri: str, command: str, lease_s: float | None = None, refresh_s: float | None = None):
        rest = uri.partition("://")[2]
        self.uri, (self.bucket, _, prefix) = uri, rest.partition("/")
        self.key = f"{prefix.strip('/')}/{LOCK_NAME}".lstrip("/")
        self.holder = holder_record(command)
        self.lease_s, self.refresh_s = lease_s or LEASE_S, refresh_s or REFRESH_S  # read at call: tests shorten them
        self.etag: str | None = None
        self.writes = 0
        self.lost: str | None = None  # why the lease was lost, once it is
        self._guard = threading.Lock()  # one conditional put at a time: the refresh thread's or check's
        self._made = threading.Lock()  # the client is made once (boto3's default session is not thread-safe)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._s3 = None

    def _client(self):
        """One client for the lease's life (boto3 clients are thread-safe): `check` runs before every upload, and a
        client made per call costs its set-up and a new connection each time."""
        import boto3

        with self._made:
            if self._s3 is None:  # AWS_ENDPOINT_URL and credentials from the environment, as raybench.infra.storage
                self._s3 = boto3.client("s3")
            return self._s3

    def _body(self) -> bytes:
        """The lease object; each write differs (`writes`), so its ETag changes and a taker that read it before a
        refresh fails its If-Match."""
        self.writes += 1
        return json.dumps({**self.holder, "lease_s": self.lease_s, "writes": self.writes}, sort_keys=True).encode()

    def acquire(self) -> None:
        from botocore.exceptions import ClientError

        s3 = self._client()
        try:
            self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*")["ETag"]
        except ClientError as err:
            if not _precondition_failed(err):
                raise
            self._take_over_if_expired(s3)
        _leases[self.uri.rstrip("/")] = self
        self._thread = threading.Thread(target=self._refresh, name="raybench-run-lease", daemon=True)
        self._thread.start()

    def _clear_hint(self) -> str:
        return (f"A lease not refreshed for {self.lease_s:.0f} s expires by itself; to clear it at once, delete "
                f"{self.uri.rstrip('/')}/{LOCK_NAME}.")

    def _take_over_if_expired(self, s3) -> None:
        from botocore.exceptions import ClientError

        try:
            got = s3.get_object(Bucket=self.bucket, Key=self.key)
            etag, holder, age = got["ETag"], json.loads(got["Body"].read()), _store_age(got)
        except (ClientError, ValueError, RecursionError):
            holder, etag, age = None, None, None
        lease_s = holder.get("lease_s") if isinstance(holder, dict) else None
        if not isinstance(lease_s, int | float) or isinstance(lease_s, bool) or lease_s <= 0:
            lease_s = LEASE_S  # a lease object without its length (an older raybench's): the default
        if etag is None or age is None or age <= lease_s:
            raise refusal(self.uri, holder, self._clear_hint())
        try:
            self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=etag)["ETag"]
        except ClientError as err:
            if _precondition_failed(err):  # someone else took it over first
                raise refusal(self.uri, holder, self._clear_hint()) from None
            raise
        log.warning("took over the expired lease of %s (held by pid %s on %s, not refreshed for %.0f s by the "
                    "store's clock)", self.uri, holder.get("pid"), holder.get("host"), age)

    def _put_refresh(self, s3) -> None:
        """Refresh the lease if it is still ours (If-Match); a lost one is recorded in `lost`. Under _guard."""
        from botocore.exceptions import ClientError

        try:
            self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=self.etag)["ETag"]
        except ClientError as err:
            if _precondition_failed(err) or err.response.get("Error", {}).get("Code") == "NoSuchKey":
                self.lost = "taken over or deleted"
                log.error("lost the lease on %s (taken over or deleted): stopping before the next upload", self.uri)
                return
            raise

    def _refresh(self) -> None:
        s3 = self._client()
        while not self._stop.wait(self.refresh_s) and self.lost is None:
            try:
                with self._guard:
                    self._put_refresh(s3)
            except Exception as err:  # a network blip: the lease has lease_s to spare
                log.warning("could not refresh the lease on %s (%s); retrying", self.uri, type(err).__name__)

    def check(self) -> None:
        """Before an upload: raise LeaseLost unless the lease object is still this holder's (same ETag). One that
        the store says is past half its length (a process that slept) is refreshed first, conditionally."""
        from botocore.exceptions import ClientError

        s3 = self._client()
        with self._guard:
            if self.lost is None:
                try:
                    head = s3.head_object(Bucket=self.bucket, Key=self.key)
                except ClientError as err:
                    if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
                        raise
                    self.lost = "deleted"
                else:
                    age = _store_age(head)
                    if head.get("ETag") != self.etag:
                        self.lost = "taken over by another run"
                    elif age is None or age > self.lease_s / 2:
                        self._put_refresh(s3)
            if self.lost is not None:
                raise _lost(self.uri, self.lost)

    def release(self) -> None:
        from botocore.exceptions import ClientError

        self._stop.set()
        if _leases.get(self.uri.rstrip("/")) is self:
            _leases.pop(self.uri.rstrip("/"))
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.etag is None or self.lost is not None:
            return
        with contextlib.suppress(ClientError):  # taken over meanwhile: it is no longer ours to delete
            self._client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)


def lease_token(uri: str) -> str | None:
    """The holder token of the lease this process holds on the s3 run `uri` (None when it holds none), to hand to
    the Ray workers that upload into the run (`adopt_lease`)."""
    lease = _leases.get(str(uri).rstrip("/"))
    return lease.holder["token"] if lease is not None else None


def adopt_lease(uri: str, token: str | None) -> None:
    """In a worker process uploading for the driver that holds the lease of `uri`: check uploads against `token`."""
    if token:
        _adopted[str(uri).rstrip("/")] = token


def check_lease(uri: str) -> None:
    """Before an upload into the s3 run `uri`: raise LeaseLost when this process's lease on it (or the driver's,
    adopted by a worker) is lost. Without either (a bare sync, e.g. in a test) nothing is checked."""
    key = str(uri).rstrip("/")
    lease = _leases.get(key)
    if lease is not None:
        lease.check()
    elif key in _adopted:
        _verify_adopted(key, _adopted[key])


_CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_DEFAULT_REGION")
_worker_s3: dict[tuple, Any] = {}  # `_verify_adopted`'s client, one per store settings (it runs before every upload)


def _worker_client():
    import boto3

    key = tuple(os.environ.get(k) for k in _CLIENT_ENV)
    if key not in _worker_s3:
        _worker_s3[key] = boto3.client("s3")
    return _worker_s3[key]


def _verify_adopted(uri: str, token: str) -> None:
    """A worker's check: the lease object still names the driver's token and the store says it is not expired."""
    from botocore.exceptions import ClientError

    bucket, _, prefix = uri.partition("://")[2].partition("/")
    try:
        got = _worker_client().get_object(Bucket=bucket, Key=f"{prefix.strip('/')}/{LOCK_NAME}".lstrip("/"))
        holder, age = json.loads(got["Body"].read()), _store_age(got)
    except ClientError as err:
        if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 404:
            raise
        raise _lost(uri, "deleted") from None
    except (ValueError, RecursionError):
        raise _lost(uri, "the lease object is unreadable") from None
    if not isinstance(holder, dict) or holder.get("token") != token:
        raise _lost(uri, "taken over by another run")
    lease_s = holder.get("lease_s")
    if age is not None and isinstance(lease_s, int | float) and age > lease_s:
        raise _lost(uri, f"not refreshed for {age:.0f} s by the store's clock")


def _precondition_failed(err) -> bool:
    meta = getattr(err, "response", {}) or {}
    return (meta.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")
            or meta.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412))

