from __future__ import annotations

from cherami.roles.outputhost.receipts import ReceiptSigner, tag_of
from cherami.wire.keys import due_ms_of, plain_key, plain_keys, seq_of, timer_key
from cherami.wire.records import Record, decode_record, encode_record


def test_receipt_round_trip_and_scope() -> None:
    signer = ReceiptSigner(epoch=7)
    receipt = signer.sign(b"q/g", 42)
    assert signer.verify(b"q/g", receipt) == 42
    assert signer.verify(b"q/other", receipt) is None


def test_forged_and_foreign_receipts_are_refused() -> None:
    signer = ReceiptSigner(epoch=1)
    receipt = signer.sign(b"q/g", 5)
    signed, index = receipt.split("~")
    tampered = signed[:-2] + ("A" if signed[-2] != "A" else "B") + signed[-1] + "~" + index
    assert signer.verify(b"q/g", tampered) is None
    assert signer.verify(b"q/g", signed + "~1") is None  # past the batch's signed size
    assert signer.verify(b"q/g", signed + "~00") is None  # not as signed
    assert signer.verify(b"q/g", signed + "~\u0660") is None  # a non-ASCII digit
    assert signer.verify(b"q/g", signed) is None
    assert signer.verify(b"q/g", "not-a-receipt!") is None
    assert signer.verify(b"q/g", "") is None
    assert ReceiptSigner(epoch=2).verify(b"q/g", receipt) is None  # another run's key


def test_a_batch_is_signed_once_and_each_receipt_names_its_delivery() -> None:
    signer = ReceiptSigner(epoch=9)
    numbers = [10, 11, 12, 13, 20, 21, 7]  # three runs
    receipts = signer.sign_all(b"q/g", numbers)
    assert len(set(receipts)) == len(numbers)
    assert len({r.split("~")[0] for r in receipts}) == 3
    assert signer.verify_all(b"q/g", receipts) == numbers
    assert signer.verify_all(b"q/g", list(reversed(receipts))) == list(reversed(numbers))
    assert signer.verify_all(b"q/other", receipts) == [None] * len(numbers)
    # a receipt can only name deliveries of its own batch, as signed
    first = receipts[0].split("~")[0]
    assert signer.verify(b"q/g", first + "~3") == 13
    assert signer.verify(b"q/g", first + "~4") is None
    assert ReceiptSigner(epoch=10).verify_all(b"q/g", receipts[:1]) == [None]


def test_tagged_receipts_name_their_output_host() -> None:
    signer = ReceiptSigner(secret=b"k" * 32, epoch=3, tag="a1b2c3d4")
    receipt = signer.sign(b"q/g", 9)
    assert tag_of(receipt) == "a1b2c3d4" and len(receipt) <= 64
    assert signer.verify(b"q/g", receipt) == 9
    untagged = ReceiptSigner(secret=b"k" * 32, epoch=3)
    assert tag_of(untagged.sign(b"q/g", 9)) == ""
    assert untagged.verify(b"q/g", receipt) is None  # another host's
    assert signer.verify(b"q/g", untagged.sign(b"q/g", 9)) is None
    assert signer.verify(b"q/g", "ffffffff." + receipt.split(".")[1]) is None
    assert signer.verify_all(b"q/g", [receipt, 5, "x" * 65]) == [9, None, None]  # type: ignore[list-item]


def test_plain_keys_sort_by_sequence() -> None:
    keys = [plain_key(s) for s in (1, 255, 256, 70000, 2**40)]
    assert keys == sorted(keys)
    assert [seq_of(k) for k in keys] == [1, 255, 256, 70000, 2**40]
    assert plain_keys(3, 3) == [plain_key(3), plain_key(4), plain_key(5)]


def test_timer_keys_sort_by_delivery_time_then_sequence() -> None:
    keys = [timer_key(2000, 1), timer_key(1000, 9), timer_key(1000, 2)]
    assert sorted(keys) == [timer_key(1000, 2), timer_key(1000, 9), timer_key(2000, 1)]
    assert (due_ms_of(keys[0]), seq_of(keys[0])) == (2000, 1)


def test_record_round_trip() -> None:
    record = Record(1, 2, b"\x00\xff", {"k": "v"}, "e:1")
    assert decode_record(encode_record(record)) == record
