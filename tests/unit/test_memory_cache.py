"""The embedded result cache keeps what is live and stays bounded: expired entries are swept, and
past its cap the entries closest to expiring go first."""

from __future__ import annotations

from criogenai.store._cache import MemoryCacheStore


def test_expired_entries_are_swept_as_new_ones_arrive() -> None:
    cache = MemoryCacheStore()
    for i in range(300):
        cache.put("t", "h", f"old{i}", "x", ttl_secs=0)  # expired as soon as written
    for i in range(600):
        cache.put("t", "h", f"new{i}", "y", ttl_secs=60)
    assert len(cache) == 600
    assert cache.get("t", "h", "new599") == "y" and cache.get("t", "h", "old0") is None


def test_past_its_cap_the_entries_closest_to_expiring_go_first() -> None:
    cache = MemoryCacheStore(max_entries=300)
    for i in range(1000):
        cache.put("t", "h", f"k{i}", str(i), ttl_secs=60 + i)
    assert len(cache) <= 600
    assert cache.get("t", "h", "k999") == "999" and cache.get("t", "h", "k0") is None
