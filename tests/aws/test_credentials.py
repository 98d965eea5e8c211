"""Credential profiles against moto_server: who signs what, lazy assumption, refresh, and clear errors.

The endpoint is the judge: a dedicated moto_server records every request with its Authorization
header, so "each component used only its own profile" is read off the access key ids the endpoint
saw, not off our own bookkeeping. IAM enforcement (moto's reset-auth) makes AccessDenied real.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import time
from pathlib import Path

import pytest

from resources.aws_credentials import CredentialProfiles, ProfileError
from resources.destinations.base import DestinationError
from resources.destinations.factory import build_destination
from resources.s3_resource import AwsCredentialsResource, ProfiledS3Resource
from resources.sinks.base import SinkError
from resources.sinks.factory import build_sink
from snapshot_assets.config import ConfigError, CredentialProfile, parse_config
from snapshot_assets.pipeline.outbox import Outbox
from snapshot_assets.pipeline.table import TablePipeline
from tests.aws.conftest import Moto, start_moto
from tests.aws.support import bucket, client, s3_dest, snapshot, table

pytestmark = pytest.mark.s3
ACCOUNT = "123456789012"
OPERATOR = f"arn:aws:iam::{ACCOUNT}:user/operator"


def role(endpoint: str, name: str, actions: list[str] | None = None, trusted: str = "*") -> str:
    """A role `trusted` may assume, whose inline policy allows `actions` (moto enforces both under enforce_iam)."""
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": trusted}, "Action": "sts:AssumeRole"}]}
    iam = client("iam", endpoint)
    arn: str = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    if actions:
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
    return arn


def profile(name: str, arn: str, sts: str, **extra: str) -> str:
    fields = {"type": "assume_role", "role_arn": arn, "endpoint_url": sts, "region": "us-east-1", **extra}
    return f"{name} {json.dumps(fields)}"


def key_id(profiles: CredentialProfiles, name: str = "") -> str:
    credentials = profiles.session(name or None).get_credentials()
    assert credentials is not None
    return str(credentials.get_frozen_credentials().access_key)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_profiles_in_one_process_each_used_only_by_its_own_component(own_moto: Moto, tmp_path: Path) -> None:
    url = own_moto.url
    archive, events = role(url, "archive-writer"), role(url, "event-publisher")
    queue = client("sqs", url).create_queue(QueueName="commits")["QueueUrl"]
    sqs = json.dumps({"type": "sqs", "queue_url": queue, "endpoint_url": url, "region": "us-east-1",
                      "credentials": "events"})
    cfg = table(tmp_path, [s3_dest(bucket(url), url, "archive")], events=[sqs],
                credentials=profile("archive", archive, url) + " " + profile("events", events, url))
    profiles = CredentialProfiles(cfg.credentials)
    setup = len(own_moto.signers())

    pipe = TablePipeline(cfg, profiles=profiles)
    assert profiles.assume_role_calls("archive") == profiles.assume_role_calls("events") == 0  # lazy
    report = pipe.commit(snapshot(pipe))

    assert report.delivery.delivered == 1 and report.delivery.pending == 0
    seen = own_moto.signers()[setup:]
    a, b = key_id(profiles, "archive"), key_id(profiles, "events")
    assert a != b and a.startswith("ASIA") and b.startswith("ASIA")  # temporary (assumed) credentials
    assert {k for s, k in seen if s == "s3"} == {a}
    assert {k for s, k in seen if s == "sqs"} == {b}
    assert [k for s, k in seen if s == "sts"] == ["testing", "testing"]  # one AssumeRole each, from ambient
    assert profiles.assume_role_calls("archive") == profiles.assume_role_calls("events") == 1


def test_assumed_role_is_refreshed_before_it_expires(moto_server: str, tmp_path: Path) -> None:
    cfg = table(tmp_path, [s3_dest("unused", moto_server)],
                credentials=profile("archive", f"arn:aws:iam::{ACCOUNT}:role/a", moto_server))
    skew = [dt.timedelta(0)]
    profiles = CredentialProfiles(cfg.credentials, clock=lambda: dt.datetime.now(dt.UTC) + skew[0])
    s3 = profiles.client("s3", "archive", component="test", endpoint_url=moto_server, path_style=True)

    s3.list_buckets()
    s3.list_buckets()
    first = key_id(profiles, "archive")
    assert profiles.assume_role_calls("archive") == 1  # assumed once, reused while fresh
    skew[0] = dt.timedelta(minutes=50)  # 10 minutes before the 1 h session ends: refresh now
    s3.list_buckets()
    assert profiles.assume_role_calls("archive") == 2 and key_id(profiles, "archive") != first


def test_expired_credentials_that_cannot_be_refreshed_name_the_destination_and_the_profile(
        moto_server: str, tmp_path: Path) -> None:
    sts = start_moto(tmp_path)  # STS on its own endpoint, so it can go away while S3 stays
    try:
        name = bucket(moto_server)
        cfg = table(tmp_path, [s3_dest(name, moto_server, "archive")],
                    credentials=profile("archive", f"arn:aws:iam::{ACCOUNT}:role/a", sts.url))
        skew = [dt.timedelta(0)]
        profiles = CredentialProfiles(cfg.credentials, clock=lambda: dt.datetime.now(dt.UTC) + skew[0])
        dest = build_destination(cfg.destinations[0], profiles=profiles)
        dest.put("k", b"1")
    finally:
        sts.stop()
    skew[0] = dt.timedelta(hours=2)
    started = time.monotonic()
    with pytest.raises(DestinationError) as raised:
        dest.put("k", b"2")
    message = str(raised.value)
    assert time.monotonic() - started < 10
    assert name in message and "credentials profile 'archive'" in message
    assert "STS endpoint is unreachable" in message and "expired at" in message


def test_unreachable_sts_fails_fast_naming_the_sink_and_the_profile(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    cfg = table(tmp_path, [s3_dest("b", dead)], credentials=profile("events", f"arn:aws:iam::{ACCOUNT}:role/e", dead))
    sink = build_sink({"type": "sqs", "queue_url": f"{dead}/{ACCOUNT}/q", "endpoint_url": dead,
                       "region": "us-east-1", "credentials": "events"},
                      client=CredentialProfiles(cfg.credentials).sink_client)
    started = time.monotonic()
    with pytest.raises(SinkError) as raised:
        sink.publish({"id": "x", "table": "t"})
    assert time.monotonic() - started < 5
    assert f"sqs:{dead}/{ACCOUNT}/q" in str(raised.value) and "credentials profile 'events'" in str(raised.value)
    assert "unreachable" in str(raised.value)


def test_profile_configuration_mistakes_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"credentials\.r\.role_arn: is required"):
        parse_config("snapshotter { source { type = generator, table = t }, destinations = [{type = local, "
                     "path = /x}], credentials { r { type = assume_role } } }", env={})
    with pytest.raises(ProfileError, match="has no role_arn"):
        CredentialProfiles({"r": CredentialProfile("r", "assume_role")})
    with pytest.raises(ProfileError, match="cycle of bases: a -> b -> a"):
        CredentialProfiles({"a": CredentialProfile("a", "assume_role", role_arn="x", base="b"),
                            "b": CredentialProfile("b", "assume_role", role_arn="y", base="a")})
    with pytest.raises(ProfileError, match=r"s3 destination s3://b/p/: unknown credentials profile 'nope' \(known: "
                                           r"none are configured\)"):
        build_destination({"type": "s3", "bucket": "b", "prefix": "p/", "credentials": "nope"})
    with pytest.raises(ProfileError, match="sns sink arn:t: unknown credentials profile 'nope'"):
        build_sink({"type": "sns", "topic_arn": "arn:t", "credentials": "nope"})


def test_access_denied_names_the_component_and_the_profile(own_moto: Moto, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    url = own_moto.url
    iam = client("iam", url)
    iam.create_user(UserName="operator")
    key = iam.create_access_key(UserName="operator")["AccessKey"]
    reader = role(url, "reader", ["s3:GetObject", "s3:ListBucket"], trusted=OPERATOR)
    locked = role(url, "locked", ["s3:*"], trusted=OPERATOR)  # not the reader role: chaining through it is denied
    iam.put_user_policy(UserName="operator", PolicyName="assume", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}]}))
    name = bucket(url)
    own_moto.enforce_iam()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    cfg = table(tmp_path, [s3_dest(name, url, "reader"), s3_dest(name, url, "locked")],
                credentials=profile("reader", reader, url) + " " + profile("locked", locked, url, base="reader"))
    profiles = CredentialProfiles(cfg.credentials)
    as_reader, as_locked = (build_destination(d, profiles=profiles) for d in cfg.destinations)

    assert as_reader.get("nothing-here") is None  # the role works for what it is allowed
    with pytest.raises(DestinationError) as denied:
        as_reader.put("k", b"x")
    assert "AccessDenied" in str(denied.value) and name in str(denied.value)
    assert f"[s3 destination s3://{name}/archive/ as credentials profile 'reader']" in str(denied.value)
    with pytest.raises(DestinationError) as refused:
        as_locked.get("k")
    assert f"credentials profile 'locked': cannot assume role {locked}: access denied" in str(refused.value)
    assert "check the role's trust policy and that credentials profile 'reader' may call" in str(refused.value)


def test_dagster_resources_sign_as_their_profile(moto_server: str, tmp_path: Path) -> None:
    cfg_file = tmp_path / "snapshotter.conf"
    creds = profile("archive", f"arn:aws:iam::{ACCOUNT}:role/a", moto_server)
    cfg_file.write_text(f"snapshotter {{ source {{ type = generator, table = users }}, "
                        f"destinations = [{{type = local, path = {json.dumps(str(tmp_path))}}}], "
                        f"credentials {{ {creds} }} }}")
    name = bucket(moto_server)
    s3 = ProfiledS3Resource(credentials="archive", endpoint_url=moto_server, region_name="us-east-1",
                            path_style=True, config_file=str(cfg_file)).get_client()
    s3.put_object(Bucket=name, Key="k", Body=b"x")
    assert s3.get_object(Bucket=name, Key="k")["Body"].read() == b"x"
    resource = AwsCredentialsResource(config_file=str(cfg_file))
    assert resource.registry() is CredentialProfiles.shared(parse_config(cfg_file.read_text(), env={}).credentials)
    assert key_id(resource.registry(), "archive").startswith("ASIA")
    assert key_id(resource.registry()) == "testing"  # "" = the ambient chain
    assert resource.get_client("sqs", "archive", endpoint_url=moto_server).list_queues() is not None


def test_outbox_dir_name_is_the_sink_name_whatever_the_profile(tmp_path: Path) -> None:
    """Counting wrappers and profiles must not move undelivered events to another outbox folder."""
    cfg = table(tmp_path, [s3_dest("b", "http://127.0.0.1:1")], events=[json.dumps(
        {"type": "kinesis", "stream": "s", "endpoint_url": "http://127.0.0.1:1", "region": "us-east-1"})])
    pipe = TablePipeline(cfg, profiles=CredentialProfiles())
    Outbox(tmp_path / "o").enqueue({"id": "t:diff:1"}, pipe.sinks)
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["kinesis_s"]
