"""The SQS-compatible endpoint (issue 32, docs/sqs.md) with the real clients, unmodified:
boto3 with its default retry configuration over every action, in the JSON protocol
(boto3's own) and in the query protocol (boto3 given the query model, below); the AWS
CLI for create, send, receive, delete and redrive; long polling, visibility expiry,
batch entry errors, redrive from the DLQ; SigV4 against an auth file's keys. The MD5s
the endpoint answers are checked against an independent computation (boto3 1.44 does
not check them itself; the Java, .NET and Go v1 SDKs do)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import botocore.session
import pytest
from botocore.exceptions import ClientError, SSLError

from cherami.roles.frontend.sqs import credentials
from tests.support.server import ServerProcess, unique
from tests.support.tlscerts import make_certs

SQS_LINE = re.compile(r"SQS endpoint at (https?://[\d.]+:\d+)")
AWS = Path(sys.executable).with_name("aws")
Client = Any  # a boto3 SQS client


# the query protocol: the installed JSON model, told `protocol: query` and given back the
# legacy names and result wrappers of SQS's query API that the JSON model dropped
LIST_MEMBERS = {  # list shape: the name of each element
    "AttributeNameList": "AttributeName", "MessageAttributeNameList": "MessageAttributeName",
    "MessageSystemAttributeList": "MessageSystemAttributeName", "QueueUrlList": "QueueUrl",
    "MessageList": "Message", "TagKeyList": "TagKey",
    "BatchResultErrorEntryList": "BatchResultErrorEntry",
    "SendMessageBatchRequestEntryList": "SendMessageBatchRequestEntry",
    "SendMessageBatchResultEntryList": "SendMessageBatchResultEntry",
    "DeleteMessageBatchRequestEntryList": "DeleteMessageBatchRequestEntry",
    "DeleteMessageBatchResultEntryList": "DeleteMessageBatchResultEntry",
    "ChangeMessageVisibilityBatchRequestEntryList": "ChangeMessageVisibilityBatchRequestEntry",
    "ChangeMessageVisibilityBatchResultEntryList": "ChangeMessageVisibilityBatchResultEntry",
    "ListMessageMoveTasksResultEntryList": "ListMessageMoveTasksResultEntry",
}  # fmt: skip
MAP_ENTRIES = {  # map shape: (its entries' name as a structure member, key, value)
    "QueueAttributeMap": ("Attribute", "Name", "Value"),
    "MessageBodyAttributeMap": ("MessageAttribute", "Name", "Value"),
    "MessageBodySystemAttributeMap": ("MessageSystemAttribute", "Name", "Value"),
    "MessageSystemAttributeMap": ("Attribute", "Name", "Value"),
    "TagMap": ("Tag", "Key", "Value"),
}
ERROR_CODES = {  # exception shape: its query code (the JSON model names it by shape only)
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "QueueNameExists": "QueueAlreadyExists",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    **{name: f"AWS.SimpleQueueService.{name}" for name in (
        "EmptyBatchRequest", "TooManyEntriesInBatchRequest", "BatchEntryIdsNotDistinct",
        "InvalidBatchEntryId", "BatchRequestTooLong", "MessageNotInflight")},
}  # fmt: skip


def query_model() -> dict[str, Any]:
    loader = botocore.session.get_session().get_component("data_loader")
    model: dict[str, Any] = loader.load_service_model("sqs", "service-2")
    meta = model["metadata"]
    meta["protocol"], meta["protocols"] = "query", ["query"]
    meta.pop("awsQueryCompatible", None)
    shapes = model["shapes"]
    for name, op in model["operations"].items():
        if "output" in op:
            op["output"]["resultWrapper"] = f"{name}Result"
    for name, element in LIST_MEMBERS.items():
        shapes[name]["member"]["locationName"] = element
    for name, (_, key, value) in MAP_ENTRIES.items():
        shapes[name]["key"]["locationName"] = key
        shapes[name]["value"]["locationName"] = value
    for name, code in ERROR_CODES.items():
        shapes[name]["error"] = {"code": code, "httpStatusCode": 400, "senderFault": True}
    for shape in shapes.values():
        for member in shape.get("members", {}).values():
            if member["shape"] in MAP_ENTRIES:
                member["locationName"] = MAP_ENTRIES[member["shape"]][0]
    return model


def sqs_client(
    url: str, protocol: str, models: Path, key: str = "test", secret: str = "test"
) -> Client:
    kwargs = {
        "endpoint_url": url,
        "region_name": "us-east-1",
        "aws_access_key_id": key,
        "aws_secret_access_key": secret,
    }
    if protocol == "json":
        return boto3.client("sqs", **kwargs)
    where = models / "sqs" / "2012-11-05"
    if not where.exists():
        where.mkdir(parents=True)
        (where / "service-2.json").write_text(json.dumps(query_model()))
    session = botocore.session.get_session()
    session.get_component("data_loader").search_paths.insert(0, str(models))
    client = boto3.Session(botocore_session=session).client("sqs", **kwargs)
    assert client.meta.service_model.protocol == "query"
    return client


def sqs_url(server: ServerProcess) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in list(server.output):
            if match := SQS_LINE.search(line):
                return match.group(1)
        time.sleep(0.05)
    raise AssertionError("the node printed no SQS endpoint:\n" + "\n".join(server.output))


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's algorithm, written here again from its description (not the server's code)."""
    out = b""
    for name in sorted(attributes):
        value = attributes[name]
        binary = value.get("BinaryValue")
        data = binary if binary is not None else value["StringValue"].encode()
        for part in (name.encode(), value["DataType"].encode()):
            out += struct.pack(">I", len(part)) + part
        out += (b"\x02" if binary is not None else b"\x01") + struct.pack(">I", len(data)) + data
    return hashlib.md5(out).hexdigest()


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def error_code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("sqs"), stores=1, extra=["--sqs-port", "0"])
    proc.start()
    yield proc
    assert proc.stop() == 0, "the node did not stop cleanly:\n" + "\n".join(proc.output)


@pytest.fixture(scope="module")
def endpoint(node: ServerProcess) -> str:
    return sqs_url(node)


@pytest.fixture(params=["json", "query"])
def sqs(
    request: pytest.FixtureRequest, endpoint: str, tmp_path_factory: pytest.TempPathFactory
) -> Client:
    return sqs_client(endpoint, request.param, tmp_path_factory.getbasetemp() / "models")


@pytest.fixture
def boto(endpoint: str, tmp_path: Path) -> Client:
    return sqs_client(endpoint, "json", tmp_path)


def test_queue_actions(sqs: Client) -> None:
    name, dlq = unique("orders"), unique("dead")
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    attributes = {
        "VisibilityTimeout": "45",
        "DelaySeconds": "0",
        "MessageRetentionPeriod": "86400",
        "MaximumMessageSize": "4096",
        "ReceiveMessageWaitTimeSeconds": "2",
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}),
    }
    url = sqs.create_queue(QueueName=name, Attributes=attributes, tags={"team": "a"})["QueueUrl"]
    assert url.endswith(f"/000000000000/{name}")
    assert sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert {k: got[k] for k in attributes if k != "RedrivePolicy"} == {
        k: v for k, v in attributes.items() if k != "RedrivePolicy"
    }
    assert json.loads(got["RedrivePolicy"]) == {
        "deadLetterTargetArn": dlq_arn,
        "maxReceiveCount": 3,
    }
    assert got["ApproximateNumberOfMessages"] == "0" and got["QueueArn"].endswith(":" + name)
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"VisibilityTimeout": "7", "DelaySeconds": "1200"}
    )
    got = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["VisibilityTimeout", "DelaySeconds"]
    )
    assert got["Attributes"] == {"VisibilityTimeout": "7", "DelaySeconds": "1200"}  # beyond 900 s
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test", "cost": "1"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["cost"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    for bad in ({"aws:x": "1"}, {"k" * 129: "1"}, {"k": "v" * 257}):
        with pytest.raises(ClientError) as err:
            sqs.tag_queue(QueueUrl=url, Tags=bad)
        assert error_code(err) == "InvalidParameterValue"
    prefix = name[:-4]
    assert sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"] == [url]
    sqs.create_queue(QueueName=prefix + "zzzz")
    first = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=1)
    second = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=1, NextToken=first["NextToken"])
    assert first["QueueUrls"] + second["QueueUrls"] == [url, url[:-4] + "zzzz"]
    assert "NextToken" not in second
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    sqs.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=0)
    sqs.purge_queue(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=name)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url, MessageBody="x")
    with pytest.raises(ClientError) as err:  # a .fifo name needs FifoQueue (test_sqs_fifo.py)
        sqs.create_queue(QueueName=name + ".fifo")
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.create_queue(QueueName="bad name!")
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.set_queue_attributes(QueueUrl=dlq_url, Attributes={"NoSuchAttribute": "1"})
    assert error_code(err) == "InvalidAttributeName"
    with pytest.raises(ClientError) as err:
        sqs.set_queue_attributes(QueueUrl=dlq_url, Attributes={"VisibilityTimeout": "-1"})
    assert error_code(err) == "InvalidAttributeValue"


def test_messages_attributes_and_md5s(sqs: Client) -> None:
    url = sqs.create_queue(QueueName=unique("msgs"))["QueueUrl"]
    attributes = {
        "customer": {"DataType": "String", "StringValue": "42 ✓"},
        "price": {"DataType": "Number", "StringValue": "12.50"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
        "order.kind": {"DataType": "String.order", "StringValue": "new"},
    }
    body = "order <1> & ünïcode"
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody=body,
        MessageAttributes=attributes,
        MessageSystemAttributes={
            "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-5"}
        },
    )
    assert sent["MD5OfMessageBody"] == md5(body)
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    got = sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
        AttributeNames=["All"],
    )["Messages"]
    (message,) = got
    assert (message["MessageId"], message["Body"]) == (sent["MessageId"], body)
    assert message["MD5OfBody"] == md5(body)
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1" and system["AWSTraceHeader"] == "Root=1-5"
    assert abs(int(system["SentTimestamp"]) / 1000 - time.time()) < 60
    # a prefix selects attributes, and the digest is of those returned
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    (again,) = sqs.receive_message(
        QueueUrl=url,
        WaitTimeSeconds=5,
        MessageAttributeNames=["order.*"],
        AttributeNames=["ApproximateReceiveCount"],
    )["Messages"]
    chosen = {"order.kind": attributes["order.kind"]}
    assert again["MessageAttributes"] == chosen
    assert again["MD5OfMessageAttributes"] == md5_of_attributes(chosen)
    assert again["Attributes"] == {"ApproximateReceiveCount": "2"}
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=600
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])  # once more: fine
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-receipt")
    with pytest.raises(ClientError) as err:  # not in flight any more
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=5
        )
    assert error_code(err) == "InvalidParameterValue"
    for bad in (
        {"MessageBody": "\x00"},
        {"MessageBody": "x" * 1_100_000},
        {"MessageBody": "x", "MessageDeduplicationId": "d"},
        {
            "MessageBody": "x",
            "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "ten"}},
        },
    ):
        with pytest.raises(ClientError) as err:
            sqs.send_message(QueueUrl=url, **bad)
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_batches_and_their_entry_errors(sqs: Client) -> None:
    url = sqs.create_queue(QueueName=unique("batch"))["QueueUrl"]
    sent = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "MessageBody": "one"},
            {
                "Id": "b",
                "MessageBody": "two",
                "DelaySeconds": 0,
                "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
            },
            {"Id": "bad", "MessageBody": "\x01"},
        ],
    )
    assert [e["Id"] for e in sent["Successful"]] == ["a", "b"]
    assert sent["Successful"][1]["MD5OfMessageAttributes"] == md5_of_attributes(
        {"k": {"DataType": "String", "StringValue": "v"}}
    )
    (failed,) = sent["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "bad",
        "InvalidMessageContents",
        True,
    )
    for entries, error in (
        ([], sqs.exceptions.EmptyBatchRequest),
        (
            [{"Id": str(i), "MessageBody": "x"} for i in range(11)],
            sqs.exceptions.TooManyEntriesInBatchRequest,
        ),
        ([{"Id": "a", "MessageBody": "x"}] * 2, sqs.exceptions.BatchEntryIdsNotDistinct),
        ([{"Id": "a b", "MessageBody": "x"}], sqs.exceptions.InvalidBatchEntryId),
    ):
        with pytest.raises(error):
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
    got: list[dict[str, Any]] = []
    wait_for(
        lambda: (
            got.extend(
                sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get(
                    "Messages", []
                )
            )
            or len(got) >= 2
        ),
        15,
        "both messages",
    )
    assert sorted(m["Body"] for m in got) == ["one", "two"]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 300},
            {"Id": "y", "ReceiptHandle": "bogus", "VisibilityTimeout": 300},
        ],
    )
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert [(e["Id"], e["Code"]) for e in changed["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"]},
            {"Id": "y", "ReceiptHandle": got[1]["ReceiptHandle"]},
            {"Id": "z", "ReceiptHandle": "bogus"},
        ],
    )
    assert [e["Id"] for e in deleted["Successful"]] == ["x", "y"]
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [("z", "ReceiptHandleIsInvalid")]
    assert sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"] == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


def test_long_poll_and_delays(boto: Client) -> None:
    url = boto.create_queue(
        QueueName=unique("poll"), Attributes={"ReceiveMessageWaitTimeSeconds": "1"}
    )["QueueUrl"]
    started = time.monotonic()
    assert "Messages" not in boto.receive_message(QueueUrl=url)  # the queue's default wait
    assert 0.9 <= time.monotonic() - started < 5
    boto.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=2)
    started = time.monotonic()
    got = boto.receive_message(QueueUrl=url, WaitTimeSeconds=15)
    waited = time.monotonic() - started
    assert [m["Body"] for m in got["Messages"]] == ["later"]
    assert 1.0 <= waited < 10, waited  # answered when it became visible, not at the end
    with pytest.raises(ClientError) as err:
        boto.receive_message(QueueUrl=url, WaitTimeSeconds=21)
    assert error_code(err) == "InvalidParameterValue"


def test_visibility_expiry(boto: Client) -> None:
    url = boto.create_queue(QueueName=unique("vis"), Attributes={"VisibilityTimeout": "1"})[
        "QueueUrl"
    ]
    boto.send_message(QueueUrl=url, MessageBody="retry me")
    (first,) = boto.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["All"])[
        "Messages"
    ]
    started = time.monotonic()
    (second,) = boto.receive_message(QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["All"])[
        "Messages"
    ]
    assert 0.5 <= time.monotonic() - started < 5  # visible again once its timeout ended
    assert (
        second["MessageId"] == first["MessageId"]
        and second["ReceiptHandle"] != first["ReceiptHandle"]
    )
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    with pytest.raises(ClientError) as err:  # the first delivery is over
        boto.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=60
        )
    assert error_code(err) == "InvalidParameterValue"
    boto.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert "Messages" not in boto.receive_message(QueueUrl=url, WaitTimeSeconds=2)


def _dead_lettered(sqs: Client, dlq_url: str, n: int) -> bool:
    attrs = sqs.get_queue_attributes(
        QueueUrl=dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return attrs["Attributes"]["ApproximateNumberOfMessages"] == str(n)


def test_redrive_from_the_dlq(sqs: Client) -> None:
    dlq_url = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    url = sqs.create_queue(
        QueueName=unique("src"),
        Attributes={
            "VisibilityTimeout": "1",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"}),
        },
    )["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    (got,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    wait_for(lambda: _dead_lettered(sqs, dlq_url, 1), 15, "the message in the DLQ")
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    (task,) = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    with pytest.raises(ClientError):
        sqs.cancel_message_move_task(TaskHandle=handle)  # done already
    (back,) = wait_for(
        lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, AttributeNames=["All"]).get(
            "Messages"
        ),
        15,
        "the message back",
    )
    assert (back["MessageId"], back["Body"]) == (got["MessageId"], "poison")
    assert back["Attributes"]["ApproximateReceiveCount"] == "1"
    # not deleted: dead-lettered again, then purged with the dead-letter queue
    wait_for(lambda: _dead_lettered(sqs, dlq_url, 1), 15, "the message in the DLQ again")
    sqs.purge_queue(QueueUrl=dlq_url)
    assert _dead_lettered(sqs, dlq_url, 0)
    sqs.start_message_move_task(SourceArn=dlq_arn)
    (task, _) = sqs.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert (task["Status"], task["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 0)
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    # to a queue that is not a source: copied there, with its attributes, and dropped
    other = sqs.create_queue(QueueName=unique("other"))["QueueUrl"]
    other_arn = dlq_arn.rsplit(":", 1)[0] + ":" + other.rsplit("/", 1)[1]
    attributes = {"n": {"DataType": "Number", "StringValue": "7"}}
    sqs.send_message(QueueUrl=url, MessageBody="poison 2", MessageAttributes=attributes)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    wait_for(lambda: _dead_lettered(sqs, dlq_url, 1), 15, "the second one in the DLQ")
    sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=other_arn)
    wait_for(
        lambda: sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]["Status"]
        == "COMPLETED",
        10, "the copy done",
    )  # fmt: skip
    (moved,) = sqs.receive_message(QueueUrl=other, WaitTimeSeconds=5,
                                   MessageAttributeNames=["All"])["Messages"]  # fmt: skip
    assert (moved["Body"], moved["MessageAttributes"]) == ("poison 2", attributes)
    assert _dead_lettered(sqs, dlq_url, 0)
    with pytest.raises(ClientError) as err:
        sqs.start_message_move_task(SourceArn=dlq_arn.replace(dlq_arn.rsplit(":", 1)[1], "nope"))
    assert error_code(err) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as err:
        sqs.start_message_move_task(SourceArn=dlq_arn, MaxNumberOfMessagesPerSecond=501)
    assert error_code(err) == "InvalidParameterValue"
    with pytest.raises(ClientError) as err:
        sqs.cancel_message_move_task(TaskHandle="not-a-handle")
    assert error_code(err) == "ResourceNotFoundException"


def test_redrive_allow_policy_and_dead_letter_source_pages(sqs: Client) -> None:
    dlq = sqs.create_queue(QueueName=unique("dlq"))["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    first, second = unique("src-a"), unique("src-b")
    allow = {
        "redrivePermission": "byQueue",
        "sourceQueueArns": [arn.rsplit(":", 1)[0] + ":" + first],
    }
    sqs.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": json.dumps(allow)})
    redrive = {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 3})}
    sqs.create_queue(QueueName=first, Attributes=redrive)
    with pytest.raises(ClientError) as err:  # not among the target's sourceQueueArns
        sqs.create_queue(QueueName=second, Attributes=redrive)
    assert error_code(err) == "InvalidAttributeValue"
    for bad in ({"redrivePermission": "byQueue"}, {"redrivePermission": "denyAll",
                "sourceQueueArns": [arn]}, {"redrivePermission": "some"}):  # fmt: skip
        with pytest.raises(ClientError) as err:
            sqs.set_queue_attributes(
                QueueUrl=dlq, Attributes={"RedriveAllowPolicy": json.dumps(bad)}
            )
        assert error_code(err) == "InvalidAttributeValue"
    sqs.set_queue_attributes(
        QueueUrl=dlq, Attributes={"RedriveAllowPolicy": '{"redrivePermission":"allowAll"}'}
    )
    sqs.create_queue(QueueName=second, Attributes=redrive)
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq, MaxResults=1)
    (url,) = page["queueUrls"]
    rest = sqs.list_dead_letter_source_queues(
        QueueUrl=dlq, MaxResults=1, NextToken=page["NextToken"]
    )
    assert [url.rsplit("/", 1)[1], *(u.rsplit("/", 1)[1] for u in rest["queueUrls"])] == [
        first,
        second,
    ]
    assert "NextToken" not in rest


def _aws(endpoint: str, tmp: Path, *args: str) -> Any:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "cli",
        "AWS_SECRET_ACCESS_KEY": "cli",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"),
    }
    done = subprocess.run(
        [str(AWS), "--endpoint-url", endpoint, "--output", "json", "sqs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else {}


def test_the_aws_cli(endpoint: str, boto: Client, tmp_path: Path) -> None:
    def cli(*args: str) -> Any:
        return _aws(endpoint, tmp_path, *args)

    dlq = cli("create-queue", "--queue-name", unique("clidlq"))["QueueUrl"]
    dlq_arn = boto.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]  # fmt: skip
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    attributes = json.dumps({"VisibilityTimeout": "1", "RedrivePolicy": redrive})
    url = cli("create-queue", "--queue-name", unique("cli"), "--attributes", attributes)[
        "QueueUrl"]  # fmt: skip
    sent = cli("send-message", "--queue-url", url, "--message-body", "from the cli",
               "--message-attributes", '{"k":{"DataType":"String","StringValue":"v"}}')  # fmt: skip
    assert sent["MD5OfMessageBody"] == md5("from the cli")
    (got,) = cli("receive-message", "--queue-url", url, "--wait-time-seconds", "5",
                 "--message-attribute-names", "All")["Messages"]  # fmt: skip
    assert (got["Body"], got["MessageAttributes"]["k"]["StringValue"]) == ("from the cli", "v")
    wait_for(lambda: _dead_lettered(boto, dlq, 1), 15, "the message in the DLQ")  # not deleted
    cli("start-message-move-task", "--source-arn", dlq_arn)
    (back,) = wait_for(
        lambda: cli("receive-message", "--queue-url", url, "--wait-time-seconds", "5").get(
            "Messages"),
        20, "the message back",
    )  # fmt: skip
    assert back["MessageId"] == got["MessageId"]
    # "=": a receipt (urlsafe base64) may start with "-", which the CLI would take for an option
    cli("delete-message", "--queue-url", url, f"--receipt-handle={back['ReceiptHandle']}")
    assert "Messages" not in boto.receive_message(QueueUrl=url, WaitTimeSeconds=2)


async def test_bad_requests_get_sqs_errors_never_a_500(endpoint: str) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    queue = unique("bad")
    url = f"{endpoint}/000000000000/{queue}"
    invalid = "InvalidParameterValue"
    json_cases = [  # (action, body, the error named in the answer); %s: the queue's URL
        ("SendMessage", b"{not json", "SerializationException"),
        ("NoSuchAction", b"{}", "InvalidAction"),
        ("SendMessage", b'{"QueueUrl": 5}', "MissingParameter"),
        ("CreateQueue", b'{"QueueName": ["x"]}', "MissingParameter"),
        ("ReceiveMessage", b'{"QueueUrl": "http://x/0/nope"}', "QueueDoesNotExist"),
        ("ReceiveMessage", b'{"QueueUrl": "%s", "MaxNumberOfMessages": "lots"}', invalid),
        ("ReceiveMessage", b'{"QueueUrl": "%s", "MessageAttributeNames": 5}', invalid),
        ("UntagQueue", b'{"QueueUrl": "%s", "TagKeys": [1]}', invalid),
        ("SendMessageBatch", b'{"QueueUrl": "%s", "Entries": "x"}', invalid),
        ("SendMessageBatch", b'{"QueueUrl": "%s", "Entries": [{"Id": 1}]}', "InvalidBatchEntryId"),
        ("SetQueueAttributes", b'{"QueueUrl": "%s", "Attributes": {"DelaySeconds": {"a": 1}}}',
         "InvalidAttributeValue"),
        ("SendMessage", b'{"QueueUrl": "%s", "MessageBody": "x", "MessageAttributes": [1]}',
         invalid),
    ]  # fmt: skip
    form_cases = [
        (b"Version=2012-11-05", "MissingAction"),
        (b"Action=SendMessage&QueueUrl=%s&MessageAttribute.x.Name=a", invalid),
        (b"Action=SendMessage&QueueUrl=%s&MessageBody=x&MessageBody.1=y", invalid),
    ]
    async with aiohttp.ClientSession() as session:
        json_type = {"Content-Type": "application/x-amz-json-1.0"}
        created = await session.post(
            endpoint + "/", data=f'{{"QueueName": "{queue}"}}',
            headers={**json_type, "X-Amz-Target": "AmazonSQS.CreateQueue"},
        )  # fmt: skip
        assert created.status == 200, await created.text()
        at = url.encode()
        requests = [
            ({**json_type, "X-Amz-Target": f"AmazonSQS.{action}"}, body.replace(b"%s", at), code)
            for action, body, code in json_cases
        ] + [(form, body.replace(b"%s", at), code) for body, code in form_cases]
        for headers, body, code in requests:
            async with session.post(endpoint + "/", data=body, headers=headers) as resp:
                text = await resp.text()
                assert resp.status == 400, (body, resp.status, text)
                assert code in text, (body, text)


def test_sigv4_against_the_auth_files_keys(tmp_path: Path) -> None:
    admin, reader = "chk_sqs-admin-key", "chk_sqs-reader-key"
    keys = [
        {"key_sha256": hashlib.sha256(admin.encode()).hexdigest(), "scopes": ["admin"]},
        {
            "key_sha256": hashlib.sha256(reader.encode()).hexdigest(),
            "scopes": ["consume"],
            "prefixes": ["orders"],
        },
    ]
    (tmp_path / "keys.json").write_text(json.dumps(keys))
    extra = ["--sqs-port", "0", "--auth-file", str(tmp_path / "keys.json")]
    proc = ServerProcess(tmp_path / "node", stores=1, extra=extra).start()
    try:
        url = sqs_url(proc)
        models = tmp_path / "models"
        for protocol in ("json", "query"):
            good = sqs_client(url, protocol, models, *credentials(admin))
            queue = good.create_queue(QueueName=unique("orders"))["QueueUrl"]
            good.send_message(QueueUrl=queue, MessageBody="signed")
            wrong = sqs_client(url, protocol, models, credentials(admin)[0], "0" * 64)
            with pytest.raises(ClientError) as err:
                wrong.send_message(QueueUrl=queue, MessageBody="forged")
            assert error_code(err) == "SignatureDoesNotMatch"
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
            unknown = sqs_client(url, protocol, models, "AKIDUNKNOWN", "x")
            with pytest.raises(ClientError) as err:
                unknown.list_queues()
            assert error_code(err) == "InvalidClientTokenId"
            consumer = sqs_client(url, protocol, models, *credentials(reader))
            (got,) = consumer.receive_message(
                QueueUrl=queue, WaitTimeSeconds=5, AttributeNames=["SenderId"]
            )["Messages"]
            assert got["Body"] == "signed"
            assert got["Attributes"] == {"SenderId": credentials(admin)[0]}  # not the reader
            consumer.delete_message(QueueUrl=queue, ReceiptHandle=got["ReceiptHandle"])
            refused = (
                partial(consumer.send_message, QueueUrl=queue, MessageBody="x"),
                partial(consumer.create_queue, QueueName=unique("orders")),
            )
            for call in refused:
                with pytest.raises(ClientError) as err:
                    call()
                assert error_code(err) == "AccessDenied"
        other = good.create_queue(QueueName=unique("other"))["QueueUrl"]
        with pytest.raises(ClientError) as err:  # outside the reader's prefixes
            consumer.receive_message(QueueUrl=other)
        assert error_code(err) == "AccessDenied"
    finally:
        assert proc.stop() == 0


def test_celerys_own_sqs_broker_runs_a_task(endpoint: str, boto: Client) -> None:
    """Celery with kombu's SQS transport, its endpoint taken from the broker URL. A
    worker's event loop fetches through pycurl, which the dev dependencies lack: the
    worker runs Celery's synchronous consumer loop (``use_eventloop=False``), in which
    the transport receives, deletes and sends through boto3."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    prefix = unique("celery") + "-"
    app = Celery("sqs-test", broker=f"sqs://AKID:SECRET@{endpoint.split('//', 1)[1]}")
    app.conf.broker_transport_options = {
        "region": "us-east-1", "queue_name_prefix": prefix, "wait_time_seconds": 1,
        "polling_interval": 0.1,
    }  # fmt: skip
    app.conf.worker_enable_remote_control = False
    ran = threading.Event()
    results: list[int] = []

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        results.append(a + b)
        ran.set()
        return a + b

    with start_worker(app, pool="solo", perform_ping_check=False, use_eventloop=False):
        add.delay(2, 3)
        assert ran.wait(30), "the task did not run"
    assert results == [5]
    (url,) = boto.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    settled = {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    wait_for(
        lambda: boto.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        == settled,
        10, "the task's message deleted",
    )  # fmt: skip


def test_the_endpoint_serves_tls_with_the_nodes_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    extra = ["--sqs-port", "0", "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    proc = ServerProcess(tmp_path / "node", stores=1, extra=extra, ca=certs.ca).start()
    try:
        url = sqs_url(proc)
        assert url.startswith("https://")
        sqs = boto3.client("sqs", endpoint_url=url, region_name="us-east-1", verify=str(certs.ca),
                           aws_access_key_id="tls", aws_secret_access_key="tls")  # fmt: skip
        queue = sqs.create_queue(QueueName=unique("tls"))["QueueUrl"]
        assert queue.startswith("https://")
        sqs.send_message(QueueUrl=queue, MessageBody="over tls")
        (got,) = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5)["Messages"]
        assert got["Body"] == "over tls"
        untrusted = boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                                 verify=str(certs.other_ca), aws_access_key_id="tls",
                                 aws_secret_access_key="tls")  # fmt: skip
        with pytest.raises(SSLError):
            untrusted.list_queues()
    finally:
        assert proc.stop() == 0
