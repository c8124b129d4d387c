"""The query protocol's parameters, as SDKs before the JSON protocol sent them (the
names of the SQS API reference's query examples) and as a current SDK derives them from
the JSON model, read into the JSON protocol's input; and XML answers."""

from __future__ import annotations

from xml.etree import ElementTree

from cherami.roles.frontend.sqs.protocol import XMLNS, SqsRequest, answer, form_params


def test_legacy_query_names() -> None:
    flat = {
        "QueueUrl": "http://h/000000000000/q", "MessageBody": "hi", "DelaySeconds": "5",
        "MessageAttribute.1.Name": "city", "MessageAttribute.1.Value.StringValue": "Any City",
        "MessageAttribute.1.Value.DataType": "String",
        "MessageAttribute.2.Name": "blob", "MessageAttribute.2.Value.BinaryValue": "AAE=",
        "MessageAttribute.2.Value.DataType": "Binary",
    }  # fmt: skip
    assert form_params(flat) == {
        "QueueUrl": "http://h/000000000000/q", "MessageBody": "hi", "DelaySeconds": "5",
        "MessageAttributes": {
            "city": {"StringValue": "Any City", "DataType": "String"},
            "blob": {"BinaryValue": "AAE=", "DataType": "Binary"},
        },
    }  # fmt: skip
    batch = {
        "SendMessageBatchRequestEntry.2.Id": "b", "SendMessageBatchRequestEntry.2.MessageBody": "2",
        "SendMessageBatchRequestEntry.1.Id": "a", "SendMessageBatchRequestEntry.1.MessageBody": "1",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name": "k",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": "v",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType": "String",
    }  # fmt: skip
    assert form_params(batch)["Entries"] == [
        {"Id": "a", "MessageBody": "1",
         "MessageAttributes": {"k": {"StringValue": "v", "DataType": "String"}}},
        {"Id": "b", "MessageBody": "2"},
    ]  # fmt: skip
    attributes = {
        "Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "40",
        "Tag.1.Key": "team", "Tag.1.Value": "a",
        "AttributeName.1": "All", "AttributeName.2": "QueueArn", "TagKey.1": "team",
    }  # fmt: skip
    assert form_params(attributes) == {
        "Attributes": {"VisibilityTimeout": "40"}, "Tags": {"team": "a"},
        "AttributeNames": ["All", "QueueArn"], "TagKeys": ["team"],
    }  # fmt: skip


def test_names_a_current_sdk_derives_from_the_json_model() -> None:
    flat = {
        "Attributes.1.key": "DelaySeconds", "Attributes.1.value": "3",
        "Entries.1.Id": "a", "Entries.1.ReceiptHandle": "r~0", "AttributeNames.1": "All",
    }  # fmt: skip
    assert form_params(flat) == {
        "Attributes": {"DelaySeconds": "3"},
        "Entries": [{"Id": "a", "ReceiptHandle": "r~0"}],
        "AttributeNames": ["All"],
    }
    assert form_params({"Entries": ""}) == {"Entries": []}  # an empty list


def test_xml_answers_use_the_query_apis_element_names() -> None:
    request = SqsRequest("ReceiveMessage", {}, True, "rid")
    result = {"Messages": [{
        "MessageId": "m", "Body": "a <b> & c",
        "Attributes": {"ApproximateReceiveCount": "1"},
        "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}},
    }]}  # fmt: skip
    body = answer(request, result).text
    assert body is not None
    root = ElementTree.fromstring(body)
    ns = {"q": XMLNS}
    message = root.find("q:ReceiveMessageResult/q:Message", ns)
    assert message is not None
    assert message.findtext("q:Body", namespaces=ns) == "a <b> & c"
    assert message.findtext("q:Attribute/q:Name", namespaces=ns) == "ApproximateReceiveCount"
    assert message.findtext("q:MessageAttribute/q:Value/q:StringValue", namespaces=ns) == "v"
    assert root.findtext("q:ResponseMetadata/q:RequestId", namespaces=ns) == "rid"
