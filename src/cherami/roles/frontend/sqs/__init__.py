"""An SQS-compatible endpoint (docs/sqs.md): unmodified SQS clients (boto3, the AWS CLI,
the other AWS SDKs, Celery's SQS broker) work against a node or a cluster's frontends
by changing only their endpoint. An SQS queue is a Cherami queue read through one group
named ``sqs``.

- protocol.py: the JSON and the query protocol, read and answered;
- sigv4.py: Signature Version 4, checked against the auth file's keys;
- queues.py, messages.py: the actions; attributes.py: queue attributes mapped onto
  Cherami's settings; model.py, md5.py: message attributes and their digests;
- backend.py, cluster.py: the roles' clients the actions use; settings.py: what SQS
  has and Cherami does not (long-poll default, redrive target, tags), and
  movetasks.py: message move tasks, both kept in the metadata store;
- errors.py: SQS's error codes; app.py: the listener."""

from cherami.roles.frontend.sqs.app import build_sqs_app, credentials

__all__ = ["build_sqs_app", "credentials"]
