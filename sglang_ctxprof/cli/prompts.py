"""Exact-length prompts for the sweep, each one distinct so SGLang's radix cache cannot fake a result.

* ``corpus`` (default): the bundled public-domain English texts (``sglang_ctxprof/data/corpus``,
  see its SOURCES.md), tokenized once by the server under test through ``/tokenize``; a prompt of
  ``n`` tokens is a window of exactly ``n`` ids of that token stream (wrapping around), sent as
  ``input_ids`` so the server counts exactly ``n`` prompt tokens.
* ``random-ids``: ``n`` ids drawn uniformly from the token ids the corpus produced (all valid ids
  of the server's tokenizer).

Prefix caching: every request of a sweep - the short and the long request of a point, and every
repeat - gets its own prompt, planned deterministically from (seed, ctx, repeat, which), and no two
prompts of a sweep start with the same two tokens, so the radix cache can match at most one token.
The same plan is rebuilt on ``--resume``.
"""

from __future__ import annotations

import random
from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "corpus"
PROMPT_MODES = ("corpus", "random-ids")
CACHE_POLICY = ("distinct prompts: the short and long request of a point, and every repeat, use "
                "different prompts of identical token length (no shared prefix beyond 1 token)")


def corpus_text() -> str:
    files = sorted(p for p in CORPUS_DIR.glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no corpus files in {CORPUS_DIR}")
    return "\n\n".join(p.read_text(encoding="utf-8").strip() for p in files) + "\n\n"


class PromptPlan:
    """Deterministic exact-length prompts keyed by (ctx, repeat, which)."""

    def __init__(self, stream: list[int], mode: str = "corpus", seed: int = 0) -> None:
        if mode not in PROMPT_MODES:
            raise ValueError(f"unknown prompt mode {mode!r}; use one of {', '.join(PROMPT_MODES)}")
        if len(stream) < 16:
            raise ValueError("the tokenized corpus is too short to build prompts")
        self.stream = stream
        self.mode = mode
        self.seed = seed
        self.vocab = sorted(set(stream))
        self._heads: set[tuple[int, int]] = set()
        self._cache: dict[tuple[int, int, str], list[int]] = {}

    def _window(self, start: int, n: int) -> list[int]:
        s, m = self.stream, len(self.stream)
        out: list[int] = []
        while len(out) < n:
            take = min(n - len(out), m - start)
            out += s[start:start + take]
            start = 0
        return out

    def _candidate(self, rng: random.Random, n: int) -> list[int]:
        if self.mode == "corpus":
            return self._window(rng.randrange(len(self.stream)), n)
        return [rng.choice(self.vocab) for _ in range(n)]

    def get(self, ctx: int, repeat: int, which: str) -> list[int]:
        """The prompt of ``ctx`` tokens for one request; call in sweep order for a stable plan."""
        key = (ctx, repeat, which)
        if key in self._cache:
            return self._cache[key]
        rng = random.Random(f"{self.seed}:{ctx}:{repeat}:{which}")
        for _ in range(10_000):
            ids = self._candidate(rng, ctx)
            head = (ids[0], ids[1] if len(ids) > 1 else -1)
            if head not in self._heads:
                break
        self._heads.add(head)
        self._cache[key] = ids
        return ids

    def plan(self, ctxs: list[int], repeats: int, whiches: tuple[str, ...]) -> None:
        """Reserve every prompt of the sweep in a fixed order (so ``--resume`` gets the same ones)."""
        for ctx in ctxs:
            for r in range(repeats):
                for w in whiches:
                    self.get(ctx, r, w)


def tokenize_corpus(client) -> tuple[list[int], int]:
    """The corpus as server token ids, and the server's max model length."""
    text = corpus_text()
    return client.tokenize(text)
