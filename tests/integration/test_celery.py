"""Celery on Cherami (issue 31): a real Celery app (tests/support/celeryapp.py) and real
``celery -A … worker`` processes against a real node, through the kombu transport
(cherami.kombu). Every task appends a line to a file, so each test counts what ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from cherami import Client
from cherami.errors import CheramiError, Unauthorized, Unavailable
from tests.support.server import ServerProcess, unique
from tests.support.tlscerts import make_certs

ROOT = Path(__file__).resolve().parents[2]
EXACTLY_ONCE_TASKS = 2000


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``check`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"not reached in {timeout} s: {what}"
        time.sleep(0.05)
    return result


class Lines:
    """The lines the tasks wrote: ``(event, key, node, pid, time)`` each."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> list[tuple[str, ...]]:
        if not self.path.exists():
            return []
        return [tuple(line.split()) for line in self.path.read_text().splitlines()]

    def keys(self, event: str) -> Counter[str]:
        return Counter(f[1] for f in self.read() if f[0] == event)


class Workers:
    """``celery worker`` processes of the test app, each in its own process group (the
    worker and its pool), ended by their group id."""

    def __init__(self, server: ServerProcess, queue: str, queue_b: str, log_dir: Path) -> None:
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CELERY_BROKER_URL": "cherami://" + server.url.removeprefix("http://"),
            "CELERY_QUEUE": queue,
            "CELERY_QUEUE_B": queue_b,
            "CELERY_BROADCAST": queue + "-all",
        }
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, node: str, *args: str, concurrency: int = 2, **env: str
    ) -> subprocess.Popen[bytes]:
        cmd = [
            sys.executable, "-m", "celery", "-A", "tests.support.celeryapp", "worker",
            "-n", f"{node}@%h", "-c", str(concurrency), "-l", "warning", "--without-mingle",
            "--without-gossip", *args,
        ]  # fmt: skip
        log = (self.log_dir / f"{node}.log").open("ab")
        env = {**self.env, "CELERY_NODE": node, **env}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        self.procs[node] = proc
        return proc

    def kill(self, node: str) -> None:
        """SIGKILL the worker and its pool processes."""
        proc = self.procs.pop(node)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, node: str) -> None:
        """SIGTERM: Celery's warm shutdown (running tasks finish, their acks go out)."""
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def log(self, node: str) -> str:
        return (self.log_dir / f"{node}.log").read_text(errors="replace")

    def close(self) -> None:
        for node in list(self.procs):
            self.kill(node)


@pytest.fixture
def celery_env(
    server: ServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, Workers, Lines, str, str]]:
    """The app (imported here with this test's broker and queues), its workers, the
    task lines, and the two queues."""
    queue, queue_b = unique("celery"), unique("celery-b")
    workers = Workers(server, queue, queue_b, tmp_path)
    for name in ("CELERY_BROKER_URL", "CELERY_QUEUE", "CELERY_QUEUE_B", "CELERY_BROADCAST"):
        monkeypatch.setenv(name, workers.env[name])
    sys.modules.pop("tests.support.celeryapp", None)
    import tests.support.celeryapp as appmod

    try:
        yield appmod, workers, Lines(tmp_path / "tasks.txt"), queue, queue_b
    finally:
        workers.close()
        appmod.app.close()
        sys.modules.pop("tests.support.celeryapp", None)


def group_stats(server: ServerProcess, queue: str) -> dict[str, Any]:
    with Client(server.url) as c:
        return c.get_group(queue, "celery")["stats"]  # type: ignore[no-any-return]


def ready(appmod: Any, node: str) -> None:
    """Wait until the worker answers a ping (remote control, over the broker)."""
    wait_for(lambda: appmod.app.control.ping([f"{node}@{os.uname().nodename}"], timeout=1.0),
             30, f"{node} answers ping")  # fmt: skip


def has_groups(server: ServerProcess, queue: str) -> bool:
    """Whether the queue exists and has a group (a binding every process sees)."""
    with Client(server.url) as c:
        try:
            return bool(c.list_groups(queue, limit=1))
        except CheramiError:
            return False


def settled(server: ServerProcess, queue: str) -> bool:
    stats = group_stats(server, queue)
    return stats["backlog"] == 0 and stats["in_flight"] == 0


def test_many_tasks_run_exactly_once_with_acks_late(server: ServerProcess, celery_env: Any) -> None:
    appmod, workers, lines, queue, _ = celery_env
    path = str(lines.path)
    workers.start("w1")
    workers.start("w2")
    ready(appmod, "w1")
    ready(appmod, "w2")  # both consuming before the first task
    started = time.monotonic()

    def publish(part: int) -> None:  # four producer threads, as in a web app
        with appmod.app.producer_or_acquire() as producer:
            for i in range(part, EXACTLY_ONCE_TASKS, 4):
                appmod.record.apply_async((path, f"t{i}"), producer=producer)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(publish, range(4)))
    published = time.monotonic() - started
    wait_for(lambda: sum(lines.keys("ran").values()) >= EXACTLY_ONCE_TASKS, 40, "every task ran")
    wait_for(lambda: settled(server, queue), 10, "every task acked")
    ran = lines.keys("ran")
    print(f"{EXACTLY_ONCE_TASKS} tasks: published in {published:.2f} s, "
          f"ran in {time.monotonic() - started:.2f} s")  # fmt: skip
    assert set(ran) == {f"t{i}" for i in range(EXACTLY_ONCE_TASKS)}
    assert [k for k, n in ran.items() if n > 1] == []
    nodes = Counter(f[2] for f in lines.read())
    assert set(nodes) == {"w1", "w2"}, nodes  # both workers took tasks


def test_failing_task_is_retried_with_countdown_then_lands_in_the_dlq(
    server: ServerProcess, celery_env: Any
) -> None:
    appmod, workers, lines, queue, _ = celery_env
    with Client(server.url) as c:  # the group made beforehand, with 2 deliveries at most
        c.create_queue(queue)
        c.create_group(queue, "celery", max_delivery_count=2)
    workers.start("w1")
    result = appmod.failing.delay(str(lines.path), "f")
    with Client(server.url) as c:
        wait_for(lambda: c.get_group(queue, "celery")["stats"]["dlq_depth"] == 1, 20, "in the DLQ")
        # the depth counts the stored record; a browse shows it once the replica read
        # knows it is on every replica (the commit point follows the append's ack)
        wait_for(lambda: len(c.dlq(queue, "celery")["messages"]) == 1, 10, "browsable")
        (dead,) = c.dlq(queue, "celery")["messages"]
    attempts = [f for f in lines.read() if f[0] == "attempt"]
    # the first run; the retry, a new message due 1 s later; then that message rejected
    # (a nack) and delivered once more: its 2nd delivery, max_delivery_count, so the DLQ
    assert [a[2] for a in attempts] == ["0", "1", "1"]
    assert float(attempts[1][5]) - float(attempts[0][5]) >= 0.9
    envelope = json.loads(dead["attributes"]["kombu"])
    assert envelope["headers"]["id"] == result.id
    assert envelope["headers"]["retries"] == 1
    wait_for(lambda: settled(server, queue), 10, "nothing left in the queue")


def test_worker_killed_mid_task_has_it_run_by_another(
    server: ServerProcess, celery_env: Any
) -> None:
    appmod, workers, lines, queue, _ = celery_env
    path = str(lines.path)
    workers.start("w1")
    appmod.slow_once.delay(path, "victim", 60)
    for i in range(200):
        appmod.record.delay(path, f"t{i}")
    wait_for(lambda: lines.keys("start")["victim"] == 1, 20, "the victim started on w1")
    workers.start("w2")
    workers.kill("w1")
    killed_at = time.time()
    wait_for(lambda: lines.keys("done")["victim"] == 1, 20, "the victim ran again")
    wait_for(lambda: len(lines.keys("ran")) == 200, 20, "every other task ran")
    wait_for(lambda: settled(server, queue), 10, "every task acked")
    victim = [f for f in lines.read() if f[1] == "victim"]
    assert [(f[0], f[2]) for f in victim] == [("start", "w1"), ("start", "w2"), ("done", "w2")]
    assert float(victim[1][4]) >= killed_at
    assert set(lines.keys("ran")) == {f"t{i}" for i in range(200)}  # nothing lost


def test_a_task_longer_than_the_visibility_timeout_runs_once(
    server: ServerProcess, celery_env: Any
) -> None:
    appmod, workers, lines, queue, _ = celery_env
    with Client(server.url) as c:  # 2 s of visibility; the task takes 4
        c.create_queue(queue)
        c.create_group(queue, "celery", visibility_timeout_seconds=2)
    workers.start("w1")  # its second pool process would run the task again, redelivered
    appmod.slow_once.delay(str(lines.path), "long", 4)
    wait_for(lambda: lines.keys("done")["long"] == 1, 30, "the long task finished")
    wait_for(lambda: settled(server, queue), 10, "acked")
    assert lines.keys("start") == Counter({"long": 1})
    assert group_stats(server, queue)["redelivered"] == 0


def test_eta_runs_once_at_its_time_across_a_worker_restart(
    server: ServerProcess, celery_env: Any
) -> None:
    appmod, workers, lines, queue, _ = celery_env
    workers.start("w1")
    ready(appmod, "w1")
    due = time.time() + 15  # "an hour ahead", shortened (w1's stop took over 5 s in CI)
    appmod.record.apply_async((str(lines.path), "later"), eta=datetime.fromtimestamp(due, UTC))
    # a Cherami delayed message, not in a worker's memory (the group's stats count it
    # once the output host has seen the queue's timer extent, opened for this message)
    wait_for(
        lambda: (lambda s: (s["backlog"], s["in_flight"]))(group_stats(server, queue)) == (1, 0),
        10, "the delayed task counted in the group's backlog",
    )  # fmt: skip
    workers.stop("w1")
    assert time.time() < due, "w1 took until the eta to stop"
    workers.start("w2")
    wait_for(lambda: lines.keys("ran")["later"] == 1, 30, "the eta task ran")
    wait_for(lambda: settled(server, queue), 10, "acked")
    (run,) = [f for f in lines.read() if f[1] == "later"]
    assert run[2] == "w2"
    assert due - 0.05 <= float(run[4]) <= due + 3
    assert lines.keys("ran")["later"] == 1


def test_an_eta_beyond_the_longest_delay_waits_again(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An eta later than Cherami's longest delay (30 days; 1 s here) is published for that
    long, then, delivered early, published again for the rest (at 1 s, 2 s): it arrives at
    its eta."""
    import cherami.celery.channel
    import cherami.kombu  # noqa: F401

    monkeypatch.setattr(cherami.celery.channel, "MAX_DELAY", 1.0)
    queue = unique("celery-eta")
    hostport = server.url.removeprefix("http://")
    due = time.time() + 3
    headers = {"eta": datetime.fromtimestamp(due, UTC).isoformat()}
    with Connection(f"cherami://{hostport}") as conn:
        conn.SimpleQueue(queue).put({"task": "later"}, headers=headers)
        message = conn.SimpleQueue(queue).get(timeout=20)
        arrived = time.time()
        message.ack()
    assert message.payload == {"task": "later"}
    assert due - 0.15 <= arrived <= due + 2
    with Client(server.url) as c:
        # published again at least once (3 times on a quiet machine: at 0, 1 and 2 s; a
        # delivery late under load leaves less than a delay for the last, which is one)
        assert 2 <= c.get_queue(queue)["stats"]["messages_published"] <= 3


def test_two_queues_with_routing_broadcast_and_remote_control(
    server: ServerProcess, celery_env: Any
) -> None:
    appmod, workers, lines, queue, queue_b = celery_env
    path, everyone = str(lines.path), queue + "-all"  # a Broadcast queue: each worker's own
    workers.start("wa", "-Q", f"{queue},{everyone}")
    workers.start("wb", "-Q", f"{queue_b},{everyone}")
    ready(appmod, "wa")
    ready(appmod, "wb")
    for i in range(20):
        appmod.record.delay(path, f"a{i}")
        appmod.routed.delay(path, f"b{i}")
    for i in range(3):
        appmod.everyone.delay(path, f"e{i}")
    wait_for(lambda: len(lines.read()) == 46, 20, "every task ran")
    where = {(f[0], f[2]) for f in lines.read()}
    assert where == {("ran", "wa"), ("routed", "wb"), ("all", "wa"), ("all", "wb")}
    assert lines.keys("all") == Counter({"e0": 2, "e1": 2, "e2": 2})
    replies = appmod.app.control.ping(timeout=2.0)
    assert {name.split("@")[0] for reply in replies for name in reply} == {"wa", "wb"}
    with Client(server.url) as c:  # each ping's reply queue and its binding are gone
        assert [q["name"] for q in c.list_queues() if "reply" in q["name"]] == []
    workers.stop("wa")  # its remote-control queue is auto-delete: gone with it
    with Client(server.url) as c:
        assert [q["name"] for q in c.list_queues(prefix="wa_40")] == []
        pidbox = c.list_groups("kombu.fanout.celery.pidbox", prefix="wa_40")
        assert [g["name"] for g in pidbox] == []


def test_task_events_reach_a_monitor_in_another_process(
    server: ServerProcess, celery_env: Any
) -> None:
    """``celery events`` and Flower read a worker's events (``-E``) through a topic
    exchange their own process binds to."""
    appmod, workers, lines, _, _ = celery_env
    workers.start("w1", "-E")
    ready(appmod, "w1")
    events: list[dict[str, Any]] = []
    with appmod.app.connection_for_read() as conn:
        receiver = appmod.app.events.Receiver(conn, handlers={"*": events.append})
        monitor = threading.Thread(target=receiver.capture, kwargs={"wakeup": False})
        monitor.start()
        try:
            wait_for(lambda: has_groups(server, "kombu.topic.celeryev"), 10, "monitor bound")
            sent: set[str] = set()
            last = [0.0]
            lifecycle = {"task-received", "task-started", "task-succeeded"}

            def whole() -> bool:
                """A task every 0.2 s until one task's whole lifecycle was seen: the
                worker reads the monitor's binding within 2 s, and a task it received
                before then had its task-received event go nowhere (as a topic exchange
                does with no queue bound), its later events reaching the monitor."""
                kinds: dict[str, set[str]] = {}
                for e in list(events):
                    kinds.setdefault(e.get("uuid", ""), set()).add(e["type"])
                if any(lifecycle <= kinds.get(uuid, set()) for uuid in sent):
                    return True
                if time.monotonic() - last[0] > 0.2:
                    sent.add(appmod.record.delay(str(lines.path), f"e{len(sent)}").id)
                    last[0] = time.monotonic()
                return False

            wait_for(whole, 20, "a task's received, started and succeeded events")
        finally:
            receiver.should_stop = True
            monitor.join(10)
    assert not has_groups(server, "kombu.topic.celeryev")  # its queue was auto-delete
    assert any(e["type"] == "worker-heartbeat" for e in events)


def test_celery_purge_then_a_result_by_rpc(server: ServerProcess, celery_env: Any) -> None:
    appmod, workers, lines, queue, _ = celery_env
    appmod.app.conf.result_backend = "rpc://"  # results come back over the broker
    for i in range(30):
        appmod.record.delay(str(lines.path), f"p{i}")
    assert group_stats(server, queue)["backlog"] == 30
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.support.celeryapp", "purge", "-f",
         "-Q", queue], cwd=ROOT, env=workers.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "Purged 30 messages from 1 known task queue" in out.stdout
    assert group_stats(server, queue)["backlog"] == 0
    workers.start("w1", RESULT_BACKEND="rpc://")
    assert appmod.record.delay(str(lines.path), "after").get(timeout=20) == "after"
    assert set(lines.keys("ran")) == {"after"}


def test_tls_api_keys_and_bad_urls(tmp_path: Path) -> None:
    """A node with TLS and API keys: the key in the URL or in the transport options,
    TLS by cherami+https:// or by broker_use_ssl; a refused key, an untrusted
    certificate and an unknown host fail with one clear error."""
    certs = make_certs(tmp_path / "certs")
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps([{"key": "celery-key", "scopes": ["admin"]}]))
    extra = ["--auth-file", str(keys), "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    node = ServerProcess(tmp_path / "node", stores=1, extra=extra, ca=certs.ca).start()
    try:
        hostport = node.url.removeprefix("https://")
        import cherami.kombu  # noqa: F401

        trusted = {"tls_ca": str(certs.ca)}
        url = f"cherami+https://:celery-key@{hostport}"
        with Connection(url, transport_options=trusted) as good:
            good.SimpleQueue("q1").put({"x": 1})
        options = {"api_key": "celery-key"}
        with Connection(f"cherami://{hostport}", ssl={"ca_certs": str(certs.ca)},
                        transport_options=options) as good:  # fmt: skip
            message = good.SimpleQueue("q1").get(timeout=10)
            assert message.payload == {"x": 1}
            message.ack()
        refused = f"cherami broker https://{hostport}: unknown API key"
        with pytest.raises(Unauthorized, match=refused):
            Connection(f"cherami+https://:wrong@{hostport}", transport_options=trusted).connect()
        untrusted = {"tls_ca": str(certs.other_ca)}
        with pytest.raises(Unavailable, match="certificate verify failed"):
            Connection(url, transport_options=untrusted).connect()
        with pytest.raises(CheramiError, match="invalid:8080: cannot resolve the host"):
            Connection("cherami://no-such-host.invalid:8080").connect()
    finally:
        node.stop()
