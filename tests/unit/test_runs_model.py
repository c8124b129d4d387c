"""A model check of the output host's runs (entry.py): random reads, stream takes with
byte budgets, HTTP takes, acks (foreign and stale ones too), nacks, extends, closed
streams, visibility timeouts, pinning, parked-row writes and dropped extents on two
extents; after every step no message is ready or in flight twice, no handle is both an
entry and in a run, every unacked ordinal has the right holder and the in-flight count
is right; at the end every message read was acked exactly once and no row is left."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from cherami.metadata.models import AckLevel, Extent
from cherami.roles.outputhost import inflight as gcmod
from cherami.roles.outputhost.entry import Delivered, Entry, Run
from cherami.roles.outputhost.extentreader import ExtentCursor
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.wire.store import PLAIN
from tests.unit.test_redelivery import _consumer, _Metadata, _read_run, write

OWNERS = [object(), object(), object()]


def mkcursor(eid: str) -> ExtentCursor:
    extent = Extent(
        id=eid, queue="q", kind=PLAIN, status="open", input_host="i", stores=["s1"], created_at=0.0
    )
    return ExtentCursor(extent, AckLevel(queue="q", group="g", extent=eid, level=b""))


def check(c: GroupConsumer, tag: object) -> None:
    flying: dict[tuple[str, bytes], int] = {}
    for no, e in c.flight.entries.items():
        assert e.no == no, (tag, "entry no")
        k = (e.cursor.id, e.key)
        assert k not in flying, (tag, "dup inflight", k)
        flying[k] = no
    assert c.flight._firsts == sorted(c.flight._runs), tag
    for first, d in c.flight._runs.items():
        assert d.first == first
        assert d.left == d.n - sum(d.settled) and d.left > 0, (tag, "left")
        for i in range(d.n):
            if not d.settled[i]:
                assert d.first + i not in c.flight.entries, (tag, "both")
                k = (d.cursor.id, d.keys[i])
                assert k not in flying, (tag, "dup run", k)
                flying[k] = d.first + i
    readyk: set[tuple[str, bytes]] = set()
    for r in c.ready:
        if isinstance(r, Run):
            ks = [(r.cursor.id, k) for k in r.keys[r.pos :]]
        else:
            ks = [(r.cursor.id, r.key)]
        for k in ks:
            assert k not in readyk and k not in flying, (tag, "ready dup", k)
            readyk.add(k)
    for cur in c.cursors.values():
        a = cur.ack
        for idx in range(a._head, len(a._keys)):
            if a._done[idx]:
                continue
            o = a._base + idx
            h = a._entries[idx]
            if isinstance(h, Entry):
                assert h.ordinal == o, (tag, "entry ordinal")
            elif isinstance(h, Run):
                assert o - h.ordinal >= h.pos, (tag, "run holder for delivered", o)
                assert any(r is h for r in c.ready), (tag, "run holder not ready")
            elif isinstance(h, Delivered):
                assert c.flight._runs.get(h.first) is h, (tag, "delivered holder gone", o)
                assert not h.settled[o - h.ordinal], (tag, "settled holder")
            else:
                raise AssertionError((tag, "holder", h))
    assert c.in_flight == len(flying)


async def one(seed: int) -> None:
    rng = random.Random(seed)
    c = _consumer(max_count=1000, read_ahead=100)
    meta = _Metadata()
    del c.cursors["e1"]
    for eid in ("e1", "e2"):
        c.cursors[eid] = mkcursor(eid)
    seq = {"e1": 1, "e2": 1}
    gen = itertools.count()
    given: list[tuple[int, object]] = []  # (no, owner)
    for step in range(300):
        op = rng.randrange(12)
        tag = (seed, step, op)
        if op <= 1:
            eid = rng.choice(list(c.cursors))
            n = rng.randrange(1, 60)
            await c.window.admit(_read_run(c.cursors[eid], range(seq[eid], seq[eid] + n)))
            seq[eid] += n
        elif op <= 3:
            owner = rng.choice(OWNERS)
            taken, cnt = c.take_runs(rng.randrange(1, 80), owner, rng.choice([1 << 20, 5, 30]))
            for t in taken:
                for no in range(t.first, t.first + t.n) if isinstance(t, Delivered) else [t.no]:
                    given.append((no, owner))
        elif op == 4:
            for e in c.take(rng.randrange(1, 5), 30.0):
                given.append((e.no, None))
        elif op in (5, 6):
            if given:
                owner = rng.choice(OWNERS + [None])
                picked = rng.sample(given, min(len(given), rng.randrange(1, 50)))
                c.ack([n for n, _ in picked], rng.choice([owner, picked[0][1]]))
        elif op == 7 and given:
            picked = rng.sample(given, min(len(given), rng.randrange(1, 10)))
            if rng.randrange(2):
                c.nack([n for n, _ in picked], rng.choice([0.0, 3600.0]), picked[0][1])
            else:
                c.extend([n for n, _ in picked], rng.choice([1.0, 3600.0]), picked[0][1])
        elif op == 8:
            c.release_owner(rng.choice(OWNERS))
        elif op == 9:
            c._expire(time.monotonic() + rng.choice([0, 40, 4000]))
            await write(meta, [c.parked], None)
        elif op == 10:
            await write(meta, [c.parked], None)
            c._pin_held(time.monotonic() + rng.random())
        elif op == 11 and rng.randrange(10) == 0:
            eid = rng.choice(list(c.cursors))
            c.drop_extent(eid)
            new = f"x{next(gen)}"
            c.cursors[new] = mkcursor(new)
            seq.pop(eid)
            seq[new] = 1
        check(c, tag)
        c.oldest_unacked_ms()
    # drain
    for rnd in range(50):
        for o in OWNERS:
            c.release_owner(o)
        c._expire(time.monotonic() + 10_000)
        await write(meta, [c.parked], None)
        c._release_due(int(time.time() * 1000) + 10**8)
        await write(meta, [c.parked], None)
        taken, _ = c.take_runs(10_000, OWNERS[0], 0)
        nos: list[int] = []
        for t in taken:
            nos += range(t.first, t.first + t.n) if isinstance(t, Delivered) else [t.no]
        assert not c.ack(nos, OWNERS[0]), ("drain stale", seed)
        await write(meta, [c.parked], None)
        check(c, ("drain", seed, rnd))
        if not c.ready and not c.in_flight and not c.parked.rows:
            break
    for eid, cur in c.cursors.items():
        assert cur.ack.acked == seq[eid] - 1 and cur.ack.window() == 0, (
            "lost",
            seed,
            eid,
            cur.ack.acked,
            seq[eid] - 1,
            cur.ack.window(),
        )
    assert not c.parked.rows, ("rows left", seed)


@pytest.mark.parametrize("min_run", [1, 16])
async def test_runs_keep_every_message_once(min_run: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcmod, "MIN_RUN", min_run)
    for seed in range(15):
        await one(seed)
