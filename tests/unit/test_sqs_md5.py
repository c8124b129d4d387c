"""SQS's MD5 digests of message bodies and attributes: AWS's own examples (the AWS SDK
for Java's test vectors, the SQS developer guide's SellerName example), and the
attributes' round trip through a Cherami message."""

from __future__ import annotations

import hashlib

from cherami.roles.frontend.sqs import model
from cherami.roles.frontend.sqs.md5 import md5_of_attributes, md5_of_body
from cherami.roles.frontend.sqs.model import AttributeValue


def test_aws_examples() -> None:
    strings = {
        "test_attribute_name_2": AttributeValue("String", "test_attribute_value_2"),
        "test_attribute_name_1": AttributeValue("String", "test_attribute_value_1"),
    }
    assert md5_of_attributes(strings) == "d53f3b558fe951154770f25cb63dbba9"
    binary = {"test_attribute_name": AttributeValue("Binary", binary=b"test_attribute_value")}
    assert md5_of_attributes(binary) == "23f6bd27ea87aab7dfeadcc9aebee495"
    seller = {"SellerName": AttributeValue("String", "Example Store")}
    assert md5_of_attributes(seller) == "cd28f3b68aeee4b2eac9c66f2f694b58"


def test_the_body_digest_is_of_its_utf8_bytes() -> None:
    assert md5_of_body("hello") == "5d41402abc4b2a76b9719d911017c592"
    assert md5_of_body("héllo ✓") == hashlib.md5("héllo ✓".encode()).hexdigest()


def test_no_attributes_no_digest() -> None:
    assert md5_of_attributes({}) is None


def test_attributes_keep_their_types_through_a_cherami_message() -> None:
    sent = model.parse_attributes({
        "plain": {"DataType": "String", "StringValue": "x"},
        "n": {"DataType": "Number.int", "StringValue": "-1.5e3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    })  # fmt: skip
    trace = model.parse_attributes(
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1"}}, system=True
    )
    stored = model.to_cherami(sent, trace)
    assert stored["plain"] == "x" and "sqs:type:plain" not in stored  # native readers see it
    back, system = model.from_cherami(stored)
    assert back == sent and system == {"AWSTraceHeader": "Root=1"}
    assert md5_of_attributes(back) == md5_of_attributes(sent)
    assert model.from_cherami({"customer": "42"})[0] == {"customer": AttributeValue("String", "42")}
