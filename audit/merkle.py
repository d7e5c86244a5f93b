"""The Merkle tree of the audit log, as RFC 9162 (Certificate Transparency 2.0, section 2.1) defines
it: no Django, no database, so the standalone bundle verifier checks proofs with it alone.

    leaf hash  SHA-256(0x00 || leaf)
    node hash  SHA-256(0x01 || left || right)
    MTH(D[n])  split at k, the largest power of two below n: HASH(0x01 || MTH(D[0:k]) || MTH(D[k:n]))

The writer keeps every complete node: the perfect, aligned subtree of 2**level leaves starting at leaf
index * 2**level is node (level, index). Any range the RFC's recursion names is a few such nodes
folded from the right (`covering`), so a root, an audit path or a consistency proof of a tree of any
size is O(log n) stored nodes (`ranges_inclusion`, `ranges_consistency`, then `hashes`).

The verifiers (`inclusion_verify`, `consistency_verify`) are the RFC's algorithms of sections 2.1.3.2
and 2.1.4.2, step for step, and need only the hashes a proof carries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

Node = tuple[int, int]  # (level, index): leaves [index << level, (index + 1) << level)
Range = tuple[int, int]  # leaves [start, end)


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH of the empty tree


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def covering(start: int, end: int) -> list[Node]:
    """The complete nodes that make up leaves [start, end), left to right, largest first: the range's
    MTH is their hashes folded from the right (`fold`). For the ranges of the RFC's recursion (their
    start a multiple of a power of two at least their size) this is exactly its split."""
    nodes = []
    while start < end:
        level = (end - start).bit_length() - 1
        while start % (1 << level):
            level -= 1
        nodes.append((level, start >> level))
        start += 1 << level
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """The hash of adjacent subtrees, largest first, combined from the right."""
    result = hashes[-1]
    for left in reversed(hashes[:-1]):
        result = node_hash(left, result)
    return result


def ranges_inclusion(index: int, size: int) -> list[Range]:
    """The ranges whose MTH make the audit path PATH(index, D[size]), in the RFC's order (the leaf's
    sibling first)."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size} leaves")
    path: list[Range] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append((lo + k, hi))
            hi = lo + k
        else:
            path.append((lo, lo + k))
            lo += k
    return path[::-1]


def ranges_consistency(first: int, second: int) -> list[Range]:
    """The ranges whose MTH make PROOF(first, D[second]) (the RFC's SUBPROOF with b true), in its order."""
    if not 0 <= first <= second:
        raise ValueError(f"no consistency proof from a tree of {first} leaves to one of {second}")
    if first in (0, second):
        return []
    proof: list[Range] = []
    lo, hi, m, complete = 0, second, first, True
    while True:
        size = hi - lo
        if m == size:
            if not complete:
                proof.append((lo, hi))
            break
        k = _split(size)
        if m <= k:
            proof.append((lo + k, hi))
            hi = lo + k
        else:
            proof.append((lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    return proof[::-1]


def hashes(ranges: Iterable[Range], nodes: Callable[[set[Node]], dict[Node, bytes]]) -> list[bytes]:
    """The MTH of each range, from the stored nodes `nodes` returns (it gets every node needed, once)."""
    ranges = list(ranges)
    parts = [covering(start, end) for start, end in ranges]
    found = nodes({node for part in parts for node in part})
    return [fold([found[node] for node in part]) for part in parts]


def root(size: int, nodes: Callable[[set[Node]], dict[Node, bytes]]) -> bytes:
    """MTH of the first `size` leaves."""
    return hashes([(0, size)], nodes)[0] if size else EMPTY_ROOT


def completed(index: int, leaf: bytes, frontier: dict[Node, bytes]) -> list[tuple[Node, bytes]]:
    """Appending the leaf hash `leaf` at `index`: the nodes it completes, itself first, each with its
    hash. `frontier` holds the complete nodes still waiting for a right sibling (the left children
    of the tree's right edge); it is updated in place."""
    made = [((0, index), leaf)]
    level, position, current = 0, index, leaf
    while position & 1:
        left = frontier.pop((level, position - 1))
        current = node_hash(left, current)
        level, position = level + 1, position >> 1
        made.append(((level, position), current))
    frontier[(level, position)] = current
    return made


def frontier_nodes(size: int) -> list[Node]:
    """The complete nodes of a tree of `size` leaves that wait for a right sibling: one per bit of size
    (the nodes `covering(0, size)` names)."""
    return covering(0, size)


def inclusion_verify(index: int, size: int, leaf: bytes, path: Sequence[bytes], root_hash: bytes) -> bool:
    """RFC 9162 2.1.3.2: does the audit path prove the leaf hash `leaf` at `index` in the tree of
    `size` leaves whose root is `root_hash`?"""
    if index >= size or index < 0:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root_hash


def consistency_verify(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 2.1.4.2: does the proof show that the tree of `second` leaves (root `second_root`)
    extends the tree of `first` leaves (root `first_root`)?"""
    if first < 0 or second < first:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof  # every tree extends the empty one
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # an exact power of two: the first tree is a node of the second
        path = [first_root, *path]
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_root and sr == second_root and sn == 0
