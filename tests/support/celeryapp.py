"""The Celery app of tests/integration/test_celery.py and benchmarks/celery_bench.py,
run by real workers (``celery -A tests.support.celeryapp worker``).

The broker is ``CELERY_BROKER_URL`` (``cherami://…``, ``redis://…`` or ``amqp://…``), the
default queue ``CELERY_QUEUE``, the queue of ``routed`` ``CELERY_QUEUE_B`` and the
broadcast queue of ``everyone`` (every worker consuming it runs it) ``CELERY_BROADCAST``. Each task
appends one line per event to the file its first argument names (O_APPEND: a line written
by any process lands whole), so a test counts what ran, where and when."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from kombu import Queue
from kombu.common import Broadcast

import cherami.kombu  # noqa: F401  (registers the cherami:// scheme)

QUEUE = os.environ.get("CELERY_QUEUE", "celery")
QUEUE_B = os.environ.get("CELERY_QUEUE_B", "celery-b")
BROADCAST = os.environ.get("CELERY_BROADCAST", "celery-all")

app = Celery("celeryapp", broker=os.environ.get("CELERY_BROKER_URL", "cherami://127.0.0.1:8080"))
app.conf.update(
    task_default_queue=QUEUE,
    task_queues=(Queue(QUEUE), Queue(QUEUE_B), Broadcast(BROADCAST)),
    task_routes={
        "tests.support.celeryapp.routed": {"queue": QUEUE_B},
        "tests.support.celeryapp.everyone": {"queue": BROADCAST, "exchange": BROADCAST},
    },
    task_acks_late=True,
    task_acks_on_failure_or_timeout=False,  # a task that fails is rejected: a nack here
    worker_prefetch_multiplier=int(os.environ.get("CELERY_PREFETCH_MULTIPLIER", "4")),
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"group_config": {"visibility_timeout_seconds": 30}},
)


def note(path: str, *fields: Any) -> None:
    """One line: the fields, the worker's node name and pid, the time."""
    line = " ".join(str(f) for f in fields)
    with open(path, "a") as out:
        out.write(f"{line} {os.environ.get('CELERY_NODE', '-')} {os.getpid()} {time.time():.3f}\n")


@app.task
def record(path: str, key: str) -> str:
    note(path, "ran", key)
    return key


@app.task
def routed(path: str, key: str) -> str:
    note(path, "routed", key)
    return key


@app.task
def everyone(path: str, key: str) -> str:
    note(path, "all", key)
    return key


@app.task
def nothing() -> None:
    """The benchmark's task: the broker's cost, not the task's."""


@app.task
def slow_once(path: str, key: str, seconds: float) -> str:
    """Sleeps ``seconds`` the first time it runs (a worker is killed meanwhile), not after."""
    first = not os.path.exists(f"{path}.{key}.started")
    note(path, "start", key)
    if first:
        open(f"{path}.{key}.started", "w").close()
        time.sleep(seconds)
    note(path, "done", key)
    return key


@app.task(bind=True, autoretry_for=(RuntimeError,), retry_kwargs={"max_retries": 1, "countdown": 1})
def failing(self: Any, path: str, key: str) -> None:
    """Always raises: retried once after 1 s (a new message), then rejected (a nack)."""
    note(path, "attempt", key, self.request.retries)
    raise RuntimeError(f"task {key} fails")
