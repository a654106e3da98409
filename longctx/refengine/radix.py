"""A prefix cache over KV pages: a radix tree of token prefixes, as SGLang's RadixCache behaves.

Read at sgl-project/sglang, python/sglang/srt/mem_cache/radix_cache.py (and the scheduler's use of it in
managers/schedule_batch.py, scheduler.py, mem_cache/common.py). What the engine follows:

- Keys are token ids matched in whole pages (page_size > 1: a node's key is a multiple of the page size and
  two keys share a prefix only page by page; page_size 1: token by token). A node's value is the pages that
  hold its tokens' KV cells, one page per ``page_size`` tokens.
- ``match`` returns the pages of the longest cached page-aligned prefix of a key, splitting a node where the
  match ends inside it; the caller points its req-to-token row at those pages (no copy).
- ``lock``/``unlock`` (SGLang's inc_lock_ref/dec_lock_ref) count the requests using a node and every node
  above it; a locked node is never evicted. ``evictable_tokens`` counts the tokens of unlocked nodes (the
  pool's free tokens plus these are what SGLang's scheduler takes as available, ``_get_token_info``).
- ``insert`` adds a key with its pages and returns how many of its tokens were already cached: the caller
  frees its own pages for those (the tree keeps the ones it had).
- ``evict`` frees unlocked leaves, least recently used first (a match or an insert touches the nodes on its
  path), going up to a parent once it becomes an unlocked leaf, until enough tokens are freed.
- ``reset`` (``/flush_cache``) drops every node; the caller refuses it while requests run.

Access order is a counter, not a clock, so that two touches in the same microsecond still order.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable

import numpy as np


class Node:
    __slots__ = ("children", "parent", "key", "pages", "lock_ref", "last_access")

    def __init__(self, parent: "Node | None", key: tuple[int, ...], pages: list[int], last_access: int):
        self.children: dict[tuple[int, ...], Node] = {}
        self.parent = parent
        self.key = key  # token ids, a whole number of pages
        self.pages = pages  # len(key) // page_size page ids
        self.lock_ref = 0
        self.last_access = last_access

    def __lt__(self, other: "Node") -> bool:  # heap order when two leaves share an access tick (never: ticks are unique)
        return self.last_access < other.last_access


class RadixCache:
    def __init__(self, page_size: int, free_pages: Callable[[list[int]], None]):
        """``free_pages`` gives pages back to the pool (evicted, or freed by reset)."""
        self.page_size = page_size
        self._free = free_pages
        self._tick = itertools.count()
        self.reset_tree()
        self.evicted_tokens = 0  # since start, for the log and the tests

    # --- the tree ------------------------------------------------------------------------
    def reset_tree(self) -> None:
        self.root = Node(None, (), [], next(self._tick))
        self.root.lock_ref = 1  # the root is never evicted
        self._evictable = 0  # tokens in unlocked nodes
        self._protected = 0  # tokens in locked nodes

    def _child_key(self, key: tuple[int, ...]) -> tuple[int, ...]:
        return key[: self.page_size]

    def _match_len(self, a: tuple[int, ...], b: tuple[int, ...]) -> int:
        """Tokens of a and b that agree from the start, in whole pages (both are whole pages long)."""
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        first_diff = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        return first_diff // self.page_size * self.page_size

    def _split(self, child: Node, at: int) -> Node:
        """Put a new node holding child's first ``at`` tokens between child and its parent; return it."""
        ps = self.page_size
        top = Node(child.parent, child.key[:at], child.pages[: at // ps], child.last_access)
        top.lock_ref = child.lock_ref
        child.parent.children[self._child_key(child.key)] = top
        child.key, child.pages, child.parent = child.key[at:], child.pages[at // ps :], top
        top.children[self._child_key(child.key)] = child
        return top

    def _aligned(self, tokens) -> tuple[int, ...]:
        n = len(tokens) // self.page_size * self.page_size
        return tuple(np.asarray(tokens[:n], dtype=np.int64).tolist())

    def match(self, tokens) -> tuple[list[int], Node]:
        """Pages of the longest cached page-aligned prefix of ``tokens`` and the node where it ends."""
        key = self._aligned(tokens)
        node, pages, now = self.root, [], next(self._tick)
        node.last_access = now
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                node = self._split(child, n)
                pages.extend(node.pages)
                break
            pages.extend(child.pages)
            node, key = child, key[n:]
        return pages, node

    def insert(self, tokens, pages: list[int]) -> int:
        """Cache the page-aligned prefix of ``tokens`` held in ``pages``; returns how many of its tokens were
        cached already (their pages in ``pages`` are the caller's to free)."""
        key = self._aligned(tokens)
        pages = list(pages[: len(key) // self.page_size])
        node, now, known = self.root, next(self._tick), 0
        node.last_access = now
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            known += n
            node, key, pages = child, key[n:], pages[n // self.page_size :]
        if key:
            leaf = Node(node, key, pages, now)
            node.children[self._child_key(key)] = leaf
            self._evictable += len(key)
        return known

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "radix node unlocked more often than locked"
            node = node.parent

    def evictable_tokens(self) -> int:
        return self._evictable

    def protected_tokens(self) -> int:
        return self._protected

    def evictable_pages(self) -> int:
        return self._evictable // self.page_size

    def _leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node is not self.root and node.lock_ref == 0:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def evict(self, num_tokens: int) -> int:
        """Free unlocked leaves, least recently used first, until ``num_tokens`` are freed; returns the
        tokens freed (less when not enough is unlocked)."""
        heap = [(n.last_access, id(n), n) for n in self._leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self._free(leaf.pages)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            del parent.children[self._child_key(leaf.key)]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        self.evicted_tokens += freed
        return freed

    def reset(self) -> int:
        """Drop every node and free their pages (only with no request holding a lock); returns tokens freed."""
        assert self._protected == 0, "the radix cache is reset while requests hold its nodes"
        freed, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            self._free(node.pages)
            freed += len(node.key)
            stack.extend(node.children.values())
        self.reset_tree()
        return freed

    def total_tokens(self) -> int:
        """Tokens in the tree (every node is locked or not): safe to read from another thread."""
        return self._evictable + self._protected
