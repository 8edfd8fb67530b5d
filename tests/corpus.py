"""A generated corpus with known answers, for the collection tests and bench/bench_collections.py.

Documents are sentences of pseudo-words drawn with a Zipf-like skew (a few words everywhere, most
rare), so ranking matters. Each query is three of one document's rarest words; the known answer is
that document.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def vocabulary(size: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def documents(count: int, seed: int = 16, words_per_doc: tuple[int, int] = (25, 60)) -> list[str]:
    """``count`` short documents of sentences, the same for the same seed."""
    rng = random.Random(seed)
    vocab = vocabulary(max(3000, count * 2), rng)
    cumulative = list(itertools.accumulate(1 / (rank + 1) ** 0.9 for rank in range(len(vocab))))
    docs = []
    for _ in range(count):
        n = rng.randint(*words_per_doc)
        picked = rng.choices(vocab, cum_weights=cumulative, k=n)
        sentences = [" ".join(picked[i : i + 8]).capitalize() + "." for i in range(0, n, 8)]
        docs.append(" ".join(sentences))
    return docs


def queries(docs: list[str], count: int, seed: int = 61) -> list[tuple[str, int]]:
    """(query, index of the document it is about): three of that document's rarest words."""
    rng = random.Random(seed)
    tokenised = [[w.strip(".").lower() for w in d.split()] for d in docs]
    df = Counter(w for words in tokenised for w in set(words))
    out = []
    for index in rng.sample(range(len(docs)), count):
        rarest = sorted(set(tokenised[index]), key=lambda w: (df[w], w))[:3]
        out.append((" ".join(rarest), index))
    return out
