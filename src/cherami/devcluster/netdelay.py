"""A packet delayer for kernels without ``sch_netem``: iptables sends the packets to delay
to an NFQUEUE, and this process holds each one for a fixed time before it accepts it.

Run inside a network namespace: ``python -m cherami.devcluster.netdelay QUEUE:MS ...``. Each
queue has one delay, so verdicts leave in arrival order and no packet overtakes another.
It speaks nfnetlink directly (no libnetfilter_queue); the rules should use
``--queue-bypass``, so that packets pass undelayed, never dropped, when it is not running.
"""

from __future__ import annotations

import collections
import errno
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 65536


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("!BBH", socket.AF_UNSPEC, 0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg
    return struct.pack("=IHHII", 16 + len(body), kind, flags, 0, 0) + body


def _packet_id(attrs: bytes) -> int | None:
    pos = 0
    while pos + 4 <= len(attrs):
        length, kind = struct.unpack_from("=HH", attrs, pos)
        if length < 4:
            return None
        if kind & 0x3FFF == NFQA_PACKET_HDR:
            return int(struct.unpack_from("!I", attrs, pos + 4)[0])
        pos += (length + 3) & ~3
    return None


def bind(sock: socket.socket, queue: int) -> None:
    """Bind ``queue`` to this socket, copying packet metadata only."""
    cmd = _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    maxlen = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
    for attrs in (cmd, params + maxlen):
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK))
        reply = sock.recv(65536)
        kind = struct.unpack_from("=H", reply, 4)[0]
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", reply, 16)[0]
            if code:
                raise OSError(-code, f"NFQUEUE {queue}: {errno.errorcode.get(-code, code)}")


def run(delays: dict[int, float]) -> None:
    """Hold each packet of queue ``q`` for ``delays[q]`` seconds, until SIGTERM."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for queue in delays:
        bind(sock, queue)
    held: dict[int, collections.deque[tuple[float, int]]] = {q: collections.deque() for q in delays}
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"netdelay ready {delays}", flush=True)
    while not stop:
        now = time.monotonic()
        due = min((q[0][0] for q in held.values() if q), default=now + 0.5)
        try:
            readable, _, _ = select.select([sock], [], [], max(0.0, due - now))
        except InterruptedError:
            continue
        if readable:
            _receive(sock, delays, held)
        now = time.monotonic()
        for queue, waiting in held.items():
            while waiting and waiting[0][0] <= now:
                verdict = struct.pack("!II", NF_ACCEPT, waiting.popleft()[1])
                sock.send(_message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, verdict)))


def _receive(
    sock: socket.socket,
    delays: dict[int, float],
    held: dict[int, collections.deque[tuple[float, int]]],
) -> None:
    while True:
        try:
            data = sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError as exc:  # ENOBUFS: the kernel dropped messages; go on
            if exc.errno == errno.ENOBUFS:
                continue
            raise
        now = time.monotonic()
        pos = 0
        while pos + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, pos)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                queue = struct.unpack_from("!H", data, pos + 18)[0]
                packet = _packet_id(data[pos + 20 : pos + length])
                if packet is not None and queue in held:
                    held[queue].append((now + delays[queue], packet))
            pos += (length + 3) & ~3


def main(argv: list[str]) -> None:
    delays = {int(q): float(ms) / 1000 for q, ms in (arg.split(":") for arg in argv)}
    run(delays)


if __name__ == "__main__":
    main(sys.argv[1:])
