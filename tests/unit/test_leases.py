"""The lease keeper: it renews a running call's claim, stops a call whose turn is cancelled, and
says so when a claim was lost (the call may then run twice)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from criogenai.runner._leases import LeaseKeeper
from criogenai.store._ledger import MemoryLedger


def test_a_held_claim_outlives_its_lease_while_renewed() -> None:
    ledger = MemoryLedger(lease_secs=0.3)
    keeper = LeaseKeeper(ledger)
    assert ledger.claim("r", "c", "me", time.time() + 60).kind == "claimed"
    keeper.hold("r", "c", "me")
    time.sleep(1.0)
    assert ledger.claim("r", "c", "other", time.time() + 60).kind == "busy"
    keeper.drop("r", "c")


def test_a_cancelled_turn_stops_its_running_call_once() -> None:
    ledger = MemoryLedger(lease_secs=0.3)
    keeper = LeaseKeeper(ledger)
    ledger.claim("r", "c", "me", time.time() + 60)
    stopped: list[int] = []
    done = threading.Event()
    keeper.hold("r", "c", "me", on_cancel=lambda: (stopped.append(1), done.set()))
    ledger.cancel("r")
    assert done.wait(2.0)
    time.sleep(0.4)
    keeper.drop("r", "c")
    assert stopped == [1]


def test_a_lost_claim_is_logged_as_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    ledger = MemoryLedger(lease_secs=0.3)
    keeper = LeaseKeeper(ledger)
    ledger.claim("r", "c", "me", time.time() + 60)
    ledger.release("r", "c")  # as if the lease ran out and the claim went elsewhere
    with caplog.at_level(logging.WARNING, logger="criogenai.worker._leases"):
        keeper.hold("r", "c", "me")
        deadline = time.monotonic() + 2.0
        while "lost its claim" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        keeper.drop("r", "c")
    assert caplog.text.count("lost its claim") == 1


def test_a_claim_its_own_filing_deleted_is_not_reported_lost(caplog: pytest.LogCaptureFixture) -> None:
    """Filing a result deletes the claim before the lease is dropped: a renewal in between finds
    it gone. That is the filing's doing, not a lost lease (at scale: thousands of false alarms)."""
    ledger = MemoryLedger(lease_secs=0.3)
    renewals = threading.Semaphore(0)
    renew = ledger.renew

    def counted(claims):  # type: ignore[no-untyped-def]
        try:
            return renew(claims)
        finally:
            renewals.release()

    ledger.renew = counted  # type: ignore[method-assign]
    keeper = LeaseKeeper(ledger)
    ledger.claim("r", "c", "me", time.time() + 60)
    with caplog.at_level(logging.WARNING):
        keeper.hold("r", "c", "me")
        keeper.filing("r", "c")
        ledger.release("r", "c")  # what the filing does to the claim
        for _ in range(3):  # renewal passes that find the claim gone
            assert renewals.acquire(timeout=5)
        keeper.drop("r", "c")
    assert "lost its claim" not in caplog.text
