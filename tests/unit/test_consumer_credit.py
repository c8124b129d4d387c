"""How a streaming consumer splits its credit over the streams its route lists
(cherami.client.credit.CreditPolicy, which StreamConsumer asks which credit frames to
send): a pure ledger, driven here through its public interface with streams named by
strings and a stand-in for the output hosts' side of the credit."""

from __future__ import annotations

from cherami.client.credit import CreditPolicy


class _Servers:
    """The output hosts' side: the credit each stream's server holds, and how it answers
    a negative credit (it takes back what it has not used for deliveries yet: ``used``
    of its credit went out already)."""

    def __init__(self) -> None:
        self.credit: dict[str, int] = {}
        self.used: dict[str, int] = {}
        self.asked_back: dict[str, list[int]] = {}

    def take(self, frames: list[tuple[str, int]]) -> dict[str, int]:
        """Apply the credit frames; what each server took back (its `returned` answers)."""
        answers: dict[str, int] = {}
        for stream, n in frames:
            held = self.credit.get(stream, 0)
            if n >= 0:
                self.credit[stream] = held + n
                continue
            taken = min(-n, held - self.used.get(stream, 0))
            self.credit[stream] = held - taken
            self.asked_back.setdefault(stream, []).append(taken)
            answers[stream] = answers.get(stream, 0) + taken
        return answers


def _policy(credit: int, expected: int) -> CreditPolicy[str]:
    policy: CreditPolicy[str] = CreditPolicy(credit)
    policy.expected = expected
    return policy


def test_a_reconnecting_stream_keeps_its_share_free() -> None:
    policy = _policy(1000, expected=2)  # "b" is listed but reconnecting
    policy.open("a")
    assert policy.grant(["a"]) == [("a", 500)]  # not the whole 1000
    policy.open("b")
    assert policy.grant(["a", "b"]) == [("b", 500)]
    assert (policy.granted("a"), policy.granted("b")) == (500, 500)


def test_a_stream_that_holds_its_credit_idle_does_not_starve_a_new_one() -> None:
    policy = _policy(1000, expected=2)
    servers = _Servers()
    servers.take(policy.grant(["a"]))
    servers.take(policy.grant(["a", "b"]))
    servers.take(policy.grant(["a", "b"]))
    assert servers.credit["b"] == 500
    assert policy.held(["a", "b"]) == 1000


def test_one_listed_stream_gets_all_the_credit() -> None:
    policy = _policy(1000, expected=1)
    assert policy.grant(["a"]) == [("a", 1000)]
    through_url = _policy(300, expected=0)  # a single node: no route, the client's URL
    assert through_url.grant([""]) == [("", 300)]


def test_nothing_is_sent_while_every_stream_holds_its_share() -> None:
    policy = _policy(1000, expected=2)
    policy.grant(["a", "b"])
    assert policy.grant(["a", "b"]) == []
    assert policy.grant([]) == []  # no open stream: nothing to send on


def test_credit_held_idle_is_asked_back_when_the_route_lists_another_host() -> None:
    # "a" was the only host listed and got all 1000; the route now lists "b" too, and
    # "a" has nothing to deliver: its 1000 sit unused at its server
    policy = _policy(1000, expected=1)
    servers = _Servers()
    servers.take(policy.grant(["a"]))
    assert servers.credit["a"] == 1000
    policy.expected = 2
    policy.open("b")
    answers = servers.take(policy.grant(["a", "b"]))
    assert servers.asked_back["a"] == [500] and policy.reclaiming("a")
    servers.take(policy.grant(["a", "b"]))  # no second request while the first is unanswered
    assert servers.asked_back["a"] == [500]
    policy.returned("a", answers["a"])  # the server's `returned` answer
    servers.take(policy.grant(["a", "b"]))
    assert (servers.credit["a"], servers.credit["b"]) == (500, 500)
    assert (policy.granted("a"), policy.granted("b")) == (500, 500)
    assert not policy.reclaiming("a")


def test_credit_already_used_for_deliveries_stays_where_it_is() -> None:
    # 900 of "a"'s 1000 went to deliveries the consumer holds: only 100 comes back now,
    # and the rest returns as those messages settle
    policy = _policy(1000, expected=1)
    servers = _Servers()
    servers.used["a"] = 900
    servers.take(policy.grant(["a"]))
    policy.expected = 2
    answers = servers.take(policy.grant(["a", "b"]))
    policy.returned("a", answers["a"])
    servers.take(policy.grant(["a", "b"]))
    assert (policy.granted("a"), policy.granted("b")) == (900, 100)
    assert policy.held(["a", "b"]) <= 1000
    policy.settled("a", 400)  # 400 of "a"'s messages were acked or nacked
    servers.take(policy.grant(["a", "b"]))
    assert (policy.granted("a"), policy.granted("b")) == (500, 500)


def test_streams_at_their_share_are_not_asked_for_credit() -> None:
    policy = _policy(1000, expected=2)
    servers = _Servers()
    servers.take(policy.grant(["a", "b"]))
    servers.take(policy.grant(["a", "b"]))
    assert servers.asked_back == {}
    assert not policy.reclaiming("a") and not policy.reclaiming("b")


def test_a_surplus_is_not_asked_back_while_no_stream_is_short() -> None:
    # "a" holds more than its new share, but the credit "a" holds leaves "b" its share
    # in full (the total is within the credit): nothing is asked back
    policy = _policy(1000, expected=1)
    policy.grant(["a"])
    policy.settled("a", 600)  # "a" holds 400 now
    policy.expected = 2
    assert policy.grant(["a", "b"]) == [("a", 100), ("b", 500)]
    assert not policy.reclaiming("a")


def test_nothing_is_asked_back_for_a_listed_stream_until_it_opens() -> None:
    # "a" and "b" hold 500 each; the route lists a third host: both are over their new
    # share, but no open stream is short, so nothing is asked back until "c" opens
    policy = _policy(1000, expected=2)
    policy.grant(["a", "b"])
    policy.expected = 3
    assert policy.grant(["a", "b"]) == []
    assert not policy.reclaiming("a") and not policy.reclaiming("b")
    assert policy.grant(["a", "b", "c"]) == [("a", -166), ("b", -167)]
    assert policy.reclaiming("a") and policy.reclaiming("b")


def test_settled_credit_is_granted_again() -> None:
    policy = _policy(100, expected=1)
    policy.grant(["a"])
    policy.settled("a", 30)
    assert policy.granted("a") == 70
    assert policy.grant(["a"]) == [("a", 30)]


def test_a_delivery_that_came_again_gives_back_one_credit_and_never_below_zero() -> None:
    policy = _policy(10, expected=1)
    policy.grant(["a"])
    policy.superseded("a")
    assert policy.granted("a") == 9
    assert policy.grant(["a"]) == [("a", 1)]
    policy.open("b")
    policy.superseded("b")  # "b" holds nothing: it stays at 0
    assert policy.granted("b") == 0


def test_a_returned_answer_never_takes_a_stream_below_zero() -> None:
    policy = _policy(10, expected=1)
    policy.grant(["a"])
    policy.returned("a", 25)
    assert policy.granted("a") == 0 and not policy.reclaiming("a")


def test_a_dropped_stream_frees_its_credit_and_is_forgotten() -> None:
    policy = _policy(1000, expected=2)
    policy.grant(["a", "b"])
    policy.drop("b")  # its stream ended: the server delivers its messages again
    assert policy.granted("b") == 0
    policy.settled("b", 5)  # late news of a dropped stream changes nothing
    policy.superseded("b")
    policy.returned("b", 5)
    assert policy.granted("b") == 0
    policy.open("b")  # reconnected: it gets its share again
    assert policy.grant(["a", "b"]) == [("b", 500)]


def test_a_closed_stream_is_left_out_of_the_split() -> None:
    # a stream whose socket closed but that is not dropped yet is not passed in: its
    # credit does not count against the others', and it is given nothing
    policy = _policy(1000, expected=2)
    policy.grant(["a", "b"])
    policy.settled("a", 500)
    assert policy.grant(["a"]) == [("a", 500)]
    assert policy.granted("b") == 500


def test_shares_split_the_remainder_and_give_every_stream_at_least_one() -> None:
    assert _policy(10, expected=3).shares(3) == [4, 3, 3]
    assert _policy(10, expected=4).shares(2) == [3, 3]  # two listed streams reconnecting
    assert _policy(10, expected=0).shares(2) == [5, 5]  # more open than listed
    assert _policy(2, expected=3).shares(3) == [1, 1, 1]


def test_with_more_streams_than_credit_each_gets_one_as_far_as_the_credit_goes() -> None:
    policy = _policy(2, expected=3)
    assert policy.grant(["a", "b", "c"]) == [("a", 1), ("b", 1)]
    assert policy.held(["a", "b", "c"]) == 2
    policy.settled("a", 1)
    assert policy.grant(["a", "b", "c"]) == [("a", 1)]  # in order: "c" waits its turn


def test_the_credit_held_never_exceeds_the_consumers_credit() -> None:
    # streams end and come back, the route changes, messages settle and come again: at
    # every step the open streams together hold at most the consumer's credit
    policy = _policy(97, expected=3)
    servers = _Servers()
    streams = ["a", "b", "c"]
    for step in range(300):
        open_now = [s for i, s in enumerate(streams) if (step + i) % 7 != 0]
        for stream in open_now:
            policy.open(stream)
        answers = servers.take(policy.grant(open_now))
        assert policy.held(open_now) <= 97
        for stream, n in answers.items():
            policy.returned(stream, n)
        victim = open_now[step % len(open_now)]
        if step % 5 == 0:
            policy.settled(victim, min(3, policy.granted(victim)))
        if step % 11 == 0:
            policy.superseded(victim)
        for stream in streams:
            if stream not in open_now or (stream == victim and step % 13 == 0):
                policy.drop(stream)  # its socket closed: the consumer drops it
                servers.credit.pop(stream, None)
        assert policy.held(streams) <= 97
        policy.expected = 2 + step % 3
