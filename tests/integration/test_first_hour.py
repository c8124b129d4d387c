"""The first hour with Cherami (issue 34): the CLI and the client against a real node."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cherami import Client, Received, Unavailable, Worker
from cherami.client.asyncclient import AsyncClient
from tests.support.server import ServerProcess, unique


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def cli_env(server: ServerProcess) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHERAMI_")}
    env["CHERAMI_URL"] = server.url
    return env


class Terminal:
    """A pseudo-terminal whose output a thread collects (the child never blocks on it)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.output = bytearray()
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:  # EIO: every process holding the slave is gone
                chunk = b""
            with self._changed:
                if not chunk:
                    self._changed.notify_all()
                    return
                self.output += chunk
                self._changed.notify_all()

    def wait_for(self, text: bytes, timeout: float = 10.0) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: text in self.output, timeout):
                raise AssertionError(f"{text!r} not written in {timeout}s: {self.output!r}")

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def finished(self, timeout: float) -> bytes:
        """Everything written once the child's end is closed (within ``timeout``)."""
        self._reader.join(timeout)
        return bytes(self.output)

    def close(self) -> None:
        os.close(self.master)


def take_terminal() -> None:
    """In the child (a session leader): make stdin its controlling terminal, so the
    terminal's ^C signals it as a shell's would."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A node process, not the shared in-process node: these tests fork CLI children
    with a preexec_fn (their own terminal), which a test process running a node's event
    loop in a thread must not do (with it, a Ctrl-C'd `cherami publish` of no lines ran
    on past 10 s, twice, among the other modules' tests)."""
    proc = ServerProcess(tmp_path_factory.mktemp("first-hour")).start()
    yield proc
    proc.stop()


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    t = Terminal()
    yield t
    t.close()


def published(server: ServerProcess, queue: str) -> int:
    with Client(server.url) as c:
        return int(c.get_queue(queue)["stats"]["messages_published"])


# 1. Ctrl-C stops `cherami publish` reading a terminal
@pytest.mark.parametrize("interrupt", ["ctrl-c key", "SIGINT"])
@pytest.mark.parametrize("lines", [[], ["one", "two"]])
def test_ctrl_c_stops_publish_reading_a_terminal(
    server: ServerProcess, terminal: Terminal, interrupt: str, lines: list[str]
) -> None:
    queue, group = unique("q"), unique("g")
    with Client(server.url) as c:
        c.create_queue(queue)
        c.create_group(queue, group, start_from="earliest")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cherami.cli.main", "publish", queue],
        stdin=terminal.slave, stdout=terminal.slave, stderr=terminal.slave,
        env=cli_env(server), start_new_session=True, preexec_fn=take_terminal,
    )  # fmt: skip
    os.close(terminal.slave)
    try:
        terminal.wait_for(b"publishing to " + queue.encode())  # its progress bar: reading
        for line in lines:
            terminal.type(line.encode() + b"\n")
        # each line typed is sent at once, not when 500 are read
        eventually(lambda: published(server, queue) == len(lines))
        if interrupt == "SIGINT":
            os.kill(proc.pid, signal.SIGINT)
        else:
            terminal.type(b"\x03")  # the terminal signals the foreground process group
        assert proc.wait(timeout=10) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = terminal.finished(timeout=10).decode(errors="replace")
    assert f"interrupted: published {len(lines)} messages\r\n" in output, output
    assert "Aborted!" not in output and "Traceback" not in output
    assert "Fatal Python error" not in output, output  # a reader left blocked at exit
    with Client(server.url) as c:
        got = c.receive(queue, group, max_messages=10, wait_seconds=1 if lines else 0)
    assert sorted(m.text for m in got) == sorted(lines)


# 2. the worker says a failed message goes to the DLQ when it does
async def test_worker_logs_the_dlq_for_a_message_at_its_last_delivery(
    server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    queue, group = unique("q"), unique("g")
    async with AsyncClient(server.url) as c:
        await c.create_queue(queue)
        await c.create_group(queue, group, max_delivery_count=2, start_from="earliest")
        await c.publish(queue, ["doomed"])
        failures: list[int] = []

        async def handler(message: Received) -> None:
            failures.append(message.delivery_count)
            raise RuntimeError("cannot handle it")

        worker = Worker(c, queue, group, handler, 1, nack_backoff=(0.0, 1.0, 0.0),
                        stop_signals=False)  # fmt: skip
        with caplog.at_level(logging.WARNING, "cherami.client.worker"):
            running = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 15
            while (await c.dlq(queue, group))["depth"] < 1:
                assert time.monotonic() < deadline, f"not in the DLQ; deliveries {failures}"
                assert not running.done()
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(running, 10)
        assert failures == [1, 2]
        logged = [r.getMessage() for r in caplog.records]
        assert len(logged) == 2, logged
        assert "delivery 1), retrying in 0.0s" in logged[0]
        assert "delivery 2 of 2), sending it to the DLQ: RuntimeError" in logged[1]
        assert "retrying" not in logged[1]


# 3. msg.text of a binary body
async def test_text_of_a_binary_delivery_names_the_message_and_body(server: ServerProcess) -> None:
    queue, group = unique("q"), unique("g")
    async with AsyncClient(server.url) as c:
        await c.create_queue(queue)
        await c.create_group(queue, group, start_from="earliest")
        (binary_id,) = await c.publish(queue, [b"\x89PNG\r\n\x1a\n"])
        (over_http,) = await c.receive(queue, group, max_messages=1, wait_seconds=5)
        await c.nack(queue, group, over_http)
        async with c.consumer(queue, group) as stream:
            over_stream = await stream.get(timeout=10)
            assert over_stream is not None
            stream.ack(over_stream)
    for message in (over_http, over_stream):
        with pytest.raises(ValueError) as caught:
            message.text  # noqa: B018
        assert str(caught.value) == (
            f"the body of message {binary_id} is not UTF-8 text (byte 0x89 at 0): "
            "read message.body, its bytes"
        )
        assert message.body == b"\x89PNG\r\n\x1a\n"


# 4. a client nobody closed leaves no "Unclosed client session" at exit
UNCLOSED = {
    "Client": """
from cherami import Client
client = Client(URL)
print(len(client.list_queues()))
""",
    "Client dropped": """
import gc
from cherami import Client
def call():
    client = Client(URL)
    return len(client.list_queues())
print(call())
gc.collect()
print(len(Client(URL).list_queues()))  # and one left at exit
""",
    "AsyncClient": """
import asyncio
from cherami import AsyncClient
async def main():
    client = AsyncClient(URL)
    print(len(await client.list_queues()))
asyncio.run(main())
""",
    "AsyncClient dropped in a running loop": """
import asyncio, gc
from cherami import AsyncClient
async def main():
    async def call():
        return len(await AsyncClient(URL).list_queues())
    print(await call())
    gc.collect()
    print(len(await AsyncClient(URL).list_queues()))
asyncio.run(main())
""",
}


@pytest.mark.parametrize("case", list(UNCLOSED))
def test_a_client_not_closed_does_not_warn_at_exit(server: ServerProcess, case: str) -> None:
    script = f"URL = {server.url!r}\n" + UNCLOSED[case]
    result = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", script],
        capture_output=True, text=True, timeout=60, env=cli_env(server), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() and all(n.isdigit() for n in result.stdout.split())
    assert "Unclosed" not in result.stderr, result.stderr
    assert result.stderr == "", result.stderr


async def test_a_publisher_used_without_async_with_opens_on_its_first_send(
    server: ServerProcess,
) -> None:
    """``client.publisher(q)`` used without ``async with`` (as a reader might, the README
    showing no streaming example): ``send`` returned a future that never resolved and
    ``flush`` waited forever, without an error. It opens on its first send now, and once
    closed a send fails at once."""
    queue = unique()
    async with AsyncClient(server.url) as client:
        await client.create_queue(queue)
        await client.create_group(queue, "g")
        pub = client.publisher(queue)
        async with asyncio.timeout(20):
            sent = await pub.send(["one"])
            await pub.flush()
            assert len(await sent) == 1
            assert await pub.publish(["two", "three"]) and pub.hosts
        await pub.close()
        after = await asyncio.wait_for(pub.send(["after"]), 5)
        assert after.done()  # failed at once, not left waiting
        with pytest.raises(Unavailable, match="publisher closed"):
            await after
        got = await client.receive(queue, "g", max_messages=10, wait_seconds=5)
        assert sorted(m.text for m in got) == ["one", "three", "two"]


def test_a_sync_publisher_used_without_with_opens_on_its_first_send(server: ServerProcess) -> None:
    queue = unique()
    with Client(server.url) as client:
        client.create_queue(queue)
        pub = client.publisher(queue)
        assert len(pub.publish(["one", "two"])) == 2
        pub.close()
