"""FIFO queues through the SQS endpoint (docs/sqs.md, "FIFO queues") with boto3
unmodified, in both protocols, against a real node: MessageGroupId as the ordering key
(one message of a group in flight at a time, in order, with competing receivers),
MessageDeduplicationId and content-based deduplication as dedup ids, SequenceNumber,
SQS's errors for what a FIFO queue refuses, the FIFO attributes read back, and a FIFO
queue that keeps its settings and its dedup window across a restart of the node."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.test_sqs import (
    Client,
    _dead_lettered,
    error_code,
    sqs_client,
    sqs_url,
    wait_for,
)
from tests.support.server import ServerProcess, unique

ALL = ["All"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("sqsfifo"), stores=1, extra=["--sqs-port", "0"])
    proc.start()
    yield proc
    assert proc.stop() == 0, "the node did not stop cleanly:\n" + "\n".join(proc.output)


@pytest.fixture(params=["json", "query"])
def sqs(
    request: pytest.FixtureRequest, node: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Client:
    return sqs_client(sqs_url(node), request.param, tmp_path_factory.getbasetemp() / "models")


def fifo_queue(sqs: Client, **attributes: str) -> str:
    name = unique("f") + ".fifo"
    made = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})
    return str(made["QueueUrl"])


def receive_all(sqs: Client, url: str, want: int) -> list[dict[str, Any]]:
    """Receive and delete until ``want`` messages came (or 10 s passed)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while len(got) < want and time.monotonic() < deadline:
        batch = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=ALL
        ).get("Messages", [])
        for m in batch:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        got += batch
    return got


def test_fifo_create_rules_and_attributes(sqs: Client) -> None:
    name = unique("f")
    with pytest.raises(ClientError) as err:  # a .fifo name needs FifoQueue=true
        sqs.create_queue(QueueName=name + ".fifo")
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:  # and FifoQueue=true a .fifo name
        sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:  # SQS: perMessageGroupId needs messageGroup
        sqs.create_queue(QueueName=name + ".fifo", Attributes={
            "FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"})  # fmt: skip
    assert error_code(err) == "InvalidAttributeValue"
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true",
                  "DeduplicationScope": "messageGroup",
                  "FifoThroughputLimit": "perMessageGroupId"}  # fmt: skip
    url = sqs.create_queue(QueueName=name + ".fifo", Attributes=attributes)["QueueUrl"]
    assert sqs.create_queue(QueueName=name + ".fifo", Attributes=attributes)["QueueUrl"] == url
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=ALL)["Attributes"]
    assert {k: got[k] for k in attributes} == attributes
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name + ".fifo", Attributes={"FifoQueue": "true"})

    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "ContentBasedDeduplication": "false", "FifoThroughputLimit": "perQueue",
        "DeduplicationScope": "queue"})  # fmt: skip
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=ALL)["Attributes"]
    assert got["ContentBasedDeduplication"] == "false"
    assert (got["DeduplicationScope"], got["FifoThroughputLimit"]) == ("queue", "perQueue")
    for bad in ({"FifoQueue": "false"}, {"DeduplicationScope": "nope"}):
        with pytest.raises(ClientError) as err:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=bad)
        assert error_code(err) in ("InvalidAttributeName", "InvalidAttributeValue")

    standard = sqs.create_queue(QueueName=unique("s"))["QueueUrl"]
    with pytest.raises(ClientError) as err:  # FIFO attributes on a standard queue
        sqs.set_queue_attributes(QueueUrl=standard, Attributes={"DeduplicationScope": "queue"})
    assert error_code(err) == "InvalidAttributeName"
    assert "FifoQueue" not in sqs.get_queue_attributes(
        QueueUrl=standard, AttributeNames=ALL)["Attributes"]  # fmt: skip

    # a FIFO queue's dead-letter queue is a FIFO queue, and a standard one's standard
    arn_of = lambda u: sqs.get_queue_attributes(  # noqa: E731
        QueueUrl=u, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]  # fmt: skip
    for source, target in ((url, standard), (standard, url)):
        policy = json.dumps({"deadLetterTargetArn": arn_of(target), "maxReceiveCount": 2})
        with pytest.raises(ClientError) as err:
            sqs.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": policy})
        assert error_code(err) == "InvalidAttributeValue"
    dlq = fifo_queue(sqs)
    policy = json.dumps({"deadLetterTargetArn": arn_of(dlq), "maxReceiveCount": 2})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [url]


def test_fifo_sends_dedup_and_sequence_numbers(sqs: Client) -> None:
    url = fifo_queue(sqs)
    with pytest.raises(ClientError) as err:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert error_code(err) == "MissingParameter"
    with pytest.raises(ClientError) as err:  # no dedup id, no content-based deduplication
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:  # per-message delays: not on a FIFO queue
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g",
                         MessageDeduplicationId="d", DelaySeconds=1)  # fmt: skip
    assert error_code(err) == "InvalidParameterValue"

    first = sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g",
                             MessageDeduplicationId="d1")  # fmt: skip
    again = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="g",
                             MessageDeduplicationId="d1")  # fmt: skip
    assert again["MessageId"] == first["MessageId"]  # a repeat: the first one's answer
    assert again["SequenceNumber"] == first["SequenceNumber"]
    out = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "b", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "d2"},
        {"Id": "nogroup", "MessageBody": "x", "MessageDeduplicationId": "d3"},
        {"Id": "c", "MessageBody": "c", "MessageGroupId": "h", "MessageDeduplicationId": "d4"},
        {"Id": "dup", "MessageBody": "x", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
    ])  # fmt: skip
    assert [(f["Id"], f["Code"]) for f in out["Failed"]] == [("nogroup", "MissingParameter")]
    ok = {e["Id"]: e for e in out["Successful"]}
    assert ok["dup"]["MessageId"] == first["MessageId"]
    numbers = [int(first["SequenceNumber"]), int(ok["b"]["SequenceNumber"]),
               int(ok["c"]["SequenceNumber"])]  # fmt: skip
    assert numbers == sorted(set(numbers)), numbers

    got = receive_all(sqs, url, 3)
    assert sorted(m["Body"] for m in got) == ["a", "b", "c"]  # the repeats not enqueued
    by_body = {m["Body"]: m["Attributes"] for m in got}
    assert by_body["a"]["MessageGroupId"] == "g"
    assert by_body["a"]["MessageDeduplicationId"] == "d1"
    assert by_body["a"]["SequenceNumber"] == first["SequenceNumber"]
    assert by_body["c"]["SequenceNumber"] == ok["c"]["SequenceNumber"]
    one = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0, ReceiveRequestAttemptId="try-1",
                              MessageSystemAttributeNames=["SequenceNumber"])  # fmt: skip
    assert one.get("Messages", []) == []

    # content-based, scoped by message group: one body twice in a group is one message,
    # in two groups two
    url = fifo_queue(sqs, ContentBasedDeduplication="true", DeduplicationScope="messageGroup")
    sent = [sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId=g)["MessageId"]
            for g in ("g1", "g1", "g2")]  # fmt: skip
    assert sent[0] == sent[1] != sent[2]
    got = receive_all(sqs, url, 2)
    assert sorted(m["Attributes"]["MessageGroupId"] for m in got) == ["g1", "g2"]
    digest = hashlib.sha256(b"same").hexdigest()
    assert {m["Attributes"]["MessageDeduplicationId"] for m in got} == {digest}


def test_fifo_order_per_group_with_competing_receivers(sqs: Client) -> None:
    """4 receivers take 10 at a time from 6 groups x 15 messages: no two messages of a
    group are ever in hand at once, and each group's come in the order sent."""
    url = fifo_queue(sqs, ContentBasedDeduplication="true")
    groups, per_group = 6, 15
    for i in range(per_group):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": f"e{g}", "MessageBody": f"{g}:{i}", "MessageGroupId": f"g{g}"}
            for g in range(groups)])  # fmt: skip
    lock = threading.Lock()
    in_hand: set[str] = set()
    seen: dict[str, list[int]] = {f"g{g}": [] for g in range(groups)}
    overlaps: list[str] = []
    errors: list[BaseException] = []

    def receiver() -> None:
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:
                with lock:
                    if sum(map(len, seen.values())) >= groups * per_group:
                        return
                batch = sqs.receive_message(
                    QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                    AttributeNames=["MessageGroupId"],
                ).get("Messages", [])  # fmt: skip
                for m in batch:
                    group = m["Attributes"]["MessageGroupId"]
                    with lock:
                        if group in in_hand:
                            overlaps.append(group)
                        in_hand.add(group)
                        seen[group].append(int(m["Body"].split(":")[1]))
                time.sleep(0.01)  # "process" them while others receive
                for m in batch:
                    with lock:  # out of hand before the delete lets the next one go
                        in_hand.discard(m["Attributes"]["MessageGroupId"])
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=receiver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not overlaps, f"groups in hand twice at once: {overlaps}"
    assert seen == {f"g{g}": list(range(per_group)) for g in range(groups)}


def test_fifo_redelivery_and_redrive_keep_the_group_in_order(sqs: Client) -> None:
    """A message whose visibility ends comes again before the next of its group; one
    received maxReceiveCount times goes to the FIFO dead-letter queue, its group goes on,
    and a move task brings it back with its group, id and SequenceNumber."""
    dlq = fifo_queue(sqs)
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]  # fmt: skip
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = fifo_queue(sqs, ContentBasedDeduplication="true", RedrivePolicy=policy)
    sent = [sqs.send_message(QueueUrl=url, MessageBody=b, MessageGroupId="g")
            for b in ("poison", "next")]  # fmt: skip

    def receive(visibility: int) -> list[dict[str, Any]]:
        return list(sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=ALL,
            VisibilityTimeout=visibility).get("Messages", []))  # fmt: skip

    first = wait_for(lambda: receive(1), 10, "the first message")
    assert [m["Body"] for m in first] == ["poison"]  # not "next" beside it
    again = wait_for(lambda: receive(30), 10, "the first message again")
    assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in again] == [
        ("poison", "2")]  # fmt: skip
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=again[0]["ReceiptHandle"],
                                  VisibilityTimeout=0)  # fmt: skip
    wait_for(lambda: _dead_lettered(sqs, dlq, 1), 15, "the poison message dead-lettered")
    after = wait_for(lambda: receive(30), 10, "the group's next message")
    assert [m["Body"] for m in after] == ["next"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=after[0]["ReceiptHandle"])
    sqs.start_message_move_task(SourceArn=dlq_arn)
    back = wait_for(lambda: receive(30), 15, "the poison message back")
    assert [(m["MessageId"], m["Attributes"]["MessageGroupId"],
             m["Attributes"]["SequenceNumber"]) for m in back] == [
        (sent[0]["MessageId"], "g", sent[0]["SequenceNumber"])]  # fmt: skip


def test_a_fifo_queue_survives_a_restart_with_its_settings(tmp_path: Path) -> None:
    proc = ServerProcess(tmp_path / "node", stores=1, extra=["--sqs-port", "0"]).start()
    try:
        sqs = sqs_client(sqs_url(proc), "json", tmp_path / "models")
        url = fifo_queue(sqs, ContentBasedDeduplication="true", DeduplicationScope="messageGroup",
                         FifoThroughputLimit="perMessageGroupId")  # fmt: skip
        before = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")
                  for i in range(3)]  # fmt: skip
        assert proc.stop() == 0
        proc.output.clear()  # the next SQS endpoint line is the restarted node's
        proc.start()
        sqs = sqs_client(sqs_url(proc), "json", tmp_path / "models")
        url = sqs.get_queue_url(QueueName=url.rsplit("/", 1)[1])["QueueUrl"]
        got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=ALL)["Attributes"]
        assert (got["FifoQueue"], got["ContentBasedDeduplication"], got["DeduplicationScope"],
                got["FifoThroughputLimit"]) == ("true", "true", "messageGroup",
                                                "perMessageGroupId")  # fmt: skip
        repeat = sqs.send_message(QueueUrl=url, MessageBody="m1", MessageGroupId="g")
        assert repeat["MessageId"] == before[1]["MessageId"]  # the window outlived the restart
        after = sqs.send_message(QueueUrl=url, MessageBody="m3", MessageGroupId="g")
        numbers = [int(m["SequenceNumber"]) for m in [*before, after]]
        assert numbers == sorted(set(numbers)), numbers
        got_messages = receive_all(sqs, url, 4)
        assert [m["Body"] for m in got_messages] == ["m0", "m1", "m2", "m3"]
    finally:
        proc.stop()
