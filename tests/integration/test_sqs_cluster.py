"""The SQS-compatible endpoint (docs/sqs.md) on a cluster's frontends, with boto3
unmodified: a frontend holds no input or output host and reaches them over the
network; with keys it passes the cluster's internal token; and two frontends share
what SQS has beyond Cherami's queues (tags, the long-poll default, the redrive target,
move tasks), which is in the metadata store. Apart from test_sqs.py so that the two
modules, each a few clusters or nodes, run side by side in the suite."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from cherami.devcluster.local import LocalCluster
from cherami.roles.frontend.sqs import credentials
from cherami.wire import handshake as h
from tests.integration.test_sqs import (
    SQS_LINE,
    Client,
    _dead_lettered,
    error_code,
    sqs_client,
    wait_for,
)
from tests.support.server import unique


def test_a_clusters_frontend_serves_it(tmp_path: Path) -> None:
    """A frontend process holds no input or output host: it publishes through the
    cluster's input host and receives, deletes and changes visibility at the output
    hosts that hold the group, each receipt at the host that issued it."""
    counts = {"storehost": 2, "controller": 1, "inputhost": 1, "outputhost": 2, "frontend": 1}
    cluster = LocalCluster(tmp_path, f"sqlite:///{tmp_path}/metadata.db", counts,
                           extra_args=["--sqs-port", "0"])  # fmt: skip
    cluster.up()
    try:
        log = cluster.procs["frontend-0"].log.read_text()
        match = SQS_LINE.search(log)
        assert match, log
        sqs = sqs_client(match.group(1), "json", tmp_path)
        url = sqs.create_queue(QueueName=unique("cluster"), Attributes={"VisibilityTimeout": "30"})[
            "QueueUrl"
        ]
        sent = {sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")["MessageId"] for i in range(20)}
        got: dict[str, dict[str, Any]] = {}

        def receive() -> bool:
            for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=1).get("Messages", []):  # fmt: skip
                got[m["MessageId"]] = m
            return len(got) >= 20

        wait_for(receive, 30, "every message received")
        assert set(got) == sent
        first, *rest = got.values()
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(rest)]
        for part in range(0, len(entries), 10):
            answer = sqs.delete_message_batch(QueueUrl=url, Entries=entries[part : part + 10])
            assert not answer.get("Failed"), answer
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"],
                                      VisibilityTimeout=0)  # fmt: skip
        again = wait_for(
            lambda: sqs.receive_message(
                QueueUrl=url, WaitTimeSeconds=1, AttributeNames=["All"]
            ).get("Messages"),
            20, "the message again",
        )  # fmt: skip
        assert again[0]["MessageId"] == first["MessageId"]
        assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"])
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        wait_for(
            lambda: set(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)[
                "Attributes"].values()) == {"0"},
            10, "the counts at 0",
        )  # fmt: skip
        _fifo_through_a_frontend(sqs)
    finally:
        cluster.down()


def _fifo_through_a_frontend(sqs: Client) -> None:
    """A FIFO queue through a frontend (docs/sqs.md, "FIFO queues"): groups and dedup ids
    reach the input host over the internal publish route, the CP group's one output
    host hands out one message of a group at a time, in order."""
    url = sqs.create_queue(QueueName=unique("cluster") + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]  # fmt: skip
    sent = [sqs.send_message(QueueUrl=url, MessageBody=f"{g}:{i}", MessageGroupId=g)
            for i in range(4) for g in ("a", "b")]  # fmt: skip
    repeat = sqs.send_message(QueueUrl=url, MessageBody="a:0", MessageGroupId="a")
    assert repeat["MessageId"] == sent[0]["MessageId"]
    numbers = [int(m["SequenceNumber"]) for m in sent]
    assert numbers == sorted(set(numbers))
    got: dict[str, list[str]] = {"a": [], "b": []}

    def receive() -> bool:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                                    AttributeNames=["All"]).get("Messages", [])  # fmt: skip
        assert len({m["Attributes"]["MessageGroupId"] for m in batch}) == len(batch)
        for m in batch:
            got[m["Attributes"]["MessageGroupId"]].append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        return sum(map(len, got.values())) >= 8

    wait_for(receive, 30, "every FIFO message received")
    assert got == {g: [f"{g}:{i}" for i in range(4)] for g in ("a", "b")}


def test_a_cluster_with_keys_serves_receives_at_its_output_hosts(tmp_path: Path) -> None:
    """A SigV4 request carries no API key for the frontend to pass on to the output host
    that holds the group: the direct call carries the cluster's internal token (refused
    as UnsupportedOperation before)."""
    admin = "chk_sqs-cluster-admin"
    (tmp_path / "keys.json").write_text(
        json.dumps(
            [{"key_sha256": hashlib.sha256(admin.encode()).hexdigest(), "scopes": ["admin"]}]
        )
    )
    counts = {"storehost": 1, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 1}
    extra = ["--sqs-port", "0", "--auth-file", str(tmp_path / "keys.json")]
    cluster = LocalCluster(tmp_path, f"sqlite:///{tmp_path}/metadata.db", counts, extra_args=extra)
    cluster.up()
    try:
        match = SQS_LINE.search(cluster.procs["frontend-0"].log.read_text())
        assert match
        sqs = sqs_client(match.group(1), "json", tmp_path, *credentials(admin))
        url = sqs.create_queue(QueueName=unique("keyed"))["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="through the input host")
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attributes["ApproximateNumberOfMessages"] == "1"
        (got,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=15)["Messages"]
        assert got["Body"] == "through the input host"
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=60
        )
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []
        # the internal token is taken on direct calls only, never in place of a key
        secret = (tmp_path / "cluster.secret").read_bytes().strip()
        token = {h.INTERNAL_HEADER: h.internal_token(h.derive_key(secret))}
        with httpx.Client() as http:
            assert http.get(f"{cluster.url}/v1/queues", headers=token).status_code == 401
    finally:
        cluster.down()


def _sqs_endpoint_of(cluster: LocalCluster, name: str) -> str:
    """The SQS endpoint of a cluster process's latest run."""
    proc = cluster.procs[name]

    def read() -> str | None:
        with open(proc.log, "rb") as log:
            log.seek(proc.log_offset)
            match = SQS_LINE.search(log.read().decode(errors="replace"))
        return match.group(1) if match else None

    return str(wait_for(read, 10, f"{name}'s SQS endpoint"))


def _move_task(sqs: Client, arn: str) -> dict[str, Any]:
    (task,) = sqs.list_message_move_tasks(SourceArn=arn, MaxResults=1)["Results"]
    return dict(task)


def test_two_frontends_share_settings_redrive_and_move_tasks(tmp_path: Path) -> None:
    """What SQS has and Cherami's queues do not (tags, the long-poll default, the redrive
    target, kept attributes, move tasks) is in the metadata store: set through frontend
    A, it holds through frontend B, and a rated move task started on A resumes when A
    restarts (before, each frontend kept its own, and move tasks lived in memory)."""
    counts = {"storehost": 1, "controller": 1, "inputhost": 1, "outputhost": 1, "frontend": 2}
    cluster = LocalCluster(tmp_path, f"sqlite:///{tmp_path}/metadata.db", counts,
                           extra_args=["--sqs-port", "0"])  # fmt: skip
    cluster.up()
    try:
        a = sqs_client(_sqs_endpoint_of(cluster, "frontend-0"), "json", tmp_path)
        b = sqs_client(_sqs_endpoint_of(cluster, "frontend-1"), "query", tmp_path)
        dlq = a.create_queue(QueueName=unique("dlq"))["QueueUrl"]
        arn = a.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        name = unique("src")
        a.create_queue(QueueName=name, tags={"team": "a"})
        url_a = a.get_queue_url(QueueName=name)["QueueUrl"]
        redrive = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
        a.set_queue_attributes(QueueUrl=url_a, Attributes={
            "ReceiveMessageWaitTimeSeconds": "2", "VisibilityTimeout": "1",
            "RedrivePolicy": redrive, "Policy": '{"Version":"2012-10-17"}',
        })  # fmt: skip
        a.tag_queue(QueueUrl=url_a, Tags={"env": "test"})
        url = b.get_queue_url(QueueName=name)["QueueUrl"]
        got = b.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (got["ReceiveMessageWaitTimeSeconds"], got["Policy"]) == (
            "2",
            '{"Version":"2012-10-17"}',
        )
        assert json.loads(got["RedrivePolicy"]) == {
            "deadLetterTargetArn": arn,
            "maxReceiveCount": 1,
        }
        assert b.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
        dlq_b = b.get_queue_url(QueueName=arn.rsplit(":", 1)[1])["QueueUrl"]
        assert b.list_dead_letter_source_queues(QueueUrl=dlq_b)["queueUrls"] == [url]
        started = time.monotonic()
        assert "Messages" not in b.receive_message(QueueUrl=url)  # A's long-poll default
        assert time.monotonic() - started >= 1.5

        # received through B once, never deleted: dead-lettered to the target set on A
        bodies = {f"poison {i}" for i in range(6)}
        for body in bodies:
            a.send_message(QueueUrl=url_a, MessageBody=body)
        seen: set[str] = set()

        def receive_all() -> bool:
            for m in b.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
                seen.add(m["Body"])
            return seen == bodies

        wait_for(receive_all, 20, "every message received once through B")
        wait_for(lambda: _dead_lettered(b, dlq_b, 6), 20, "six messages dead-lettered")

        # a move task at 1 msg/s started on A, A killed at once (the task 5 s or more
        # from its end), seen running on B, resumed by A after its restart
        handle = a.start_message_move_task(SourceArn=arn, MaxNumberOfMessagesPerSecond=1)[
            "TaskHandle"
        ]
        cluster.kill("frontend-0")
        task = _move_task(b, arn)
        assert (task["Status"], task["TaskHandle"], task["ApproximateNumberOfMessagesToMove"]) == (
            "RUNNING", handle, 6,
        )  # fmt: skip
        assert task["ApproximateNumberOfMessagesMoved"] < 6
        with pytest.raises(ClientError) as err:  # one running task a queue, as on SQS
            b.start_message_move_task(SourceArn=arn)
        assert error_code(err) == "InvalidParameterValue"
        cluster.restart("frontend-0")
        a = sqs_client(_sqs_endpoint_of(cluster, "frontend-0"), "json", tmp_path)
        done = wait_for(lambda: (t := _move_task(a, arn))["Status"] == "COMPLETED" and t, 30,
                        "the task completed")  # fmt: skip
        assert done["ApproximateNumberOfMessagesMoved"] == 6
        assert "TaskHandle" not in done
        back: set[str] = set()

        def receive_back() -> bool:
            for m in b.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=1).get("Messages", []):  # fmt: skip
                back.add(m["Body"])
                b.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            return back == bodies

        wait_for(receive_back, 20, "every message back in its queue")
        assert _dead_lettered(a, dlq, 0)
        a.delete_queue(QueueUrl=url_a)  # its settings go with it
        a.create_queue(QueueName=name)
        assert "Tags" not in b.list_queue_tags(QueueUrl=url)
        assert b.list_dead_letter_source_queues(QueueUrl=dlq_b).get("queueUrls", []) == []
    finally:
        cluster.down()
