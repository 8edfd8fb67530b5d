"""The transport's memory of messages acknowledged with their result stays bounded when acks never come."""

from __future__ import annotations

import threading

from criogenai.worker import _transport


def test_a_worker_whose_acks_never_come_remembers_at_most_ten_thousand_tags() -> None:
    # Given 50,000 calls filed with their message acknowledged in Redis, whose ack from Celery
    # never reaches the transport
    before = len(_transport._acked_with_result)
    for i in range(50_000):
        _transport.acked_with_result(f"lost-ack-{i}")
    # Then the transport's memory of them stays bounded
    assert len(_transport._acked_with_result) <= max(10_000, before)


def test_tags_whose_ack_never_comes_are_bounded_and_the_newest_kept() -> None:
    # Given tags marked acknowledged with their result, whose ack from Celery never comes (its
    # connection lost meanwhile), many more than the bound
    tags = _transport._AckedTags(keep=100)
    for i in range(1_000):
        tags.add(f"t{i}")
    # Then only the newest are remembered: an ack of one of them takes the cheap way, once;
    # an ack of an old one takes kombu's own (it is no longer remembered)
    assert len(tags) == 100
    assert tags.take("t999") and not tags.take("t999")
    assert not tags.take("t0")


def test_tags_added_and_taken_from_several_threads_are_all_accounted_for() -> None:
    tags = _transport._AckedTags(keep=50)
    taken: list[bool] = []

    def churn(n: int) -> None:
        for i in range(2_000):
            tags.add(f"{n}-{i}")
            taken.append(tags.take(f"{n}-{i}"))

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each thread takes its tag right after adding it: at most 4 are kept at once, so none was
    # dropped early, and nothing is left behind
    assert taken.count(True) == 8_000 and len(tags) == 0
