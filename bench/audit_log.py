"""The transparency log's proofs: their size and the time to check one offline, at 10^3, 10^6 and 10^7
leaves.

    python -m bench.audit_log --sizes 1000 1000000 10000000 --samples 20000

Builds one tree of the largest size in memory with audit.merkle.completed, leaf after leaf, as the
sealer grows the stored one (audit.log.grow), keeping every complete node (what LogNode rows hold),
32 bytes each in one bytearray per level. The smaller sizes are prefixes of it: the complete nodes of
a tree of n leaves are those of the larger tree that lie within its first n leaves, so their roots and
proofs come from the same nodes (`audit.merkle.hashes` of `ranges_inclusion` / `ranges_consistency`,
the functions audit.log answers with), and each is checked against a plain recursive MTH at the
smallest size. No database: what a proof weighs and what an offline verifier (audit.bundle, any
RFC 9162 verifier) spends on it.

Per size: the audit path's hashes (min, median, max over --samples random leaves) and bytes (raw, and
as a bundle carries it: a JSON list of hex strings); `audit.merkle.inclusion_verify` time, median of
the samples (each timed alone, after one untimed warm-up); the consistency proof's hashes from a tree
one sealer batch (1000 leaves) smaller, and from random smaller sizes, with `consistency_verify` time.
Prints JSON lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from audit import merkle  # noqa: E402  (no Django: the module the standalone verifier uses)


class Tree:
    """Every complete node of a tree grown leaf by leaf, 32 bytes each, one bytearray per level."""

    def __init__(self) -> None:
        self.levels: list[bytearray] = []
        self.size = 0
        self._frontier: dict[merkle.Node, bytes] = {}

    def append(self, leaf_hash: bytes) -> None:
        for (level, index), hash_ in merkle.completed(self.size, leaf_hash, self._frontier):
            if level == len(self.levels):
                self.levels.append(bytearray())
            stored = self.levels[level]
            assert len(stored) == 32 * index, (level, index)  # each level's nodes come in index order
            stored += hash_
        self.size += 1

    def nodes(self, wanted: set[merkle.Node]) -> dict[merkle.Node, bytes]:
        return {(lv, i): bytes(self.levels[lv][32 * i : 32 * i + 32]) for lv, i in wanted}

    def leaf(self, index: int) -> bytes:
        return bytes(self.levels[0][32 * index : 32 * index + 32])


def leaf_data(index: int) -> bytes:
    """A stand-in for a seal's leaf (proof.seal_leaf): its size does not change any proof."""
    return f"run-chain-{index:012d} 21 {hashlib.sha256(index.to_bytes(8, 'big')).hexdigest()}".encode()


def reference_root(leaves: list[bytes]) -> bytes:
    """RFC 9162 MTH, by its recursion: the check of the stored nodes at a small size."""
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(reference_root(leaves[:k]), reference_root(leaves[k:]))


def timed_us(fn, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        started = time.perf_counter_ns()
        ok = fn()
        out.append((time.perf_counter_ns() - started) / 1000)
        assert ok
    return out


def summary(values: list[float], digits: int = 2) -> dict[str, float]:
    values = sorted(values)
    return {
        "median": round(statistics.median(values), digits),
        "min": round(values[0], digits),
        "max": round(values[-1], digits),
    }


def measure(tree: Tree, size: int, samples: int, rng: random.Random) -> dict:
    root = merkle.root(size, tree.nodes)
    indexes = [rng.randrange(size) for _ in range(samples)]
    proofs = [(i, merkle.hashes(merkle.ranges_inclusion(i, size), tree.nodes)) for i in indexes]
    counts = [len(p) for _, p in proofs]
    json_bytes = [len(json.dumps([h.hex() for h in p])) for _, p in proofs]
    # Each check times one inclusion_verify of a genuine proof (a fresh leaf each time), nothing else.
    merkle.inclusion_verify(proofs[0][0], size, tree.leaf(proofs[0][0]), proofs[0][1], root)
    leaves = [tree.leaf(i) for i, _ in proofs]  # fetched before timing: only the check is timed
    items = iter(zip(indexes, leaves, (p for _, p in proofs), strict=True))

    def check_only() -> bool:
        i, leaf, path = next(items)
        return merkle.inclusion_verify(i, size, leaf, path, root)

    check_us = timed_us(check_only, samples)
    # A wrong leaf is refused (the proofs are not vacuous).
    assert not merkle.inclusion_verify(indexes[0], size, merkle.leaf_hash(b"other"), proofs[0][1], root)

    consistency = {}
    for label, firsts in (
        ("one batch (1000 leaves) earlier", [max(1, size - 1000)]),
        ("random earlier size", [rng.randrange(1, size) for _ in range(min(samples, 2000))]),
    ):
        sized, check_c = [], []
        for first in firsts:
            proof = merkle.hashes(merkle.ranges_consistency(first, size), tree.nodes)
            first_root = merkle.root(first, tree.nodes)
            sized.append(len(proof))
            started = time.perf_counter_ns()
            ok = merkle.consistency_verify(first, size, first_root, root, proof)
            check_c.append((time.perf_counter_ns() - started) / 1000)
            assert ok, (first, size)
        consistency[label] = {
            "from": firsts[0] if len(firsts) == 1 else f"{len(firsts)} random sizes",
            "hashes": summary(sized, 0),
            "bytes_raw_max": 32 * max(sized),
            "verify_us": summary(check_c),
        }
    return {
        "leaves": size,
        "root": root.hex()[:16],
        "inclusion_hashes": summary(counts, 0),
        "inclusion_bytes_raw": summary([32 * c for c in counts], 0),
        "inclusion_bytes_json_hex": summary(json_bytes, 0),
        "inclusion_verify_us": summary(check_us),
        "samples": samples,
        "consistency": consistency,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 1_000_000, 10_000_000])
    parser.add_argument("--samples", type=int, default=20000, help="random leaves per size")
    args = parser.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    largest = max(args.sizes)
    tree = Tree()
    started = time.perf_counter()
    for index in range(largest):
        tree.append(merkle.leaf_hash(leaf_data(index)))
        if index and index % 1_000_000 == 0:
            print(f"  {index} leaves, {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    build_s = time.perf_counter() - started
    smallest = min(args.sizes)
    expected = reference_root([merkle.leaf_hash(leaf_data(i)) for i in range(smallest)])
    assert merkle.root(smallest, tree.nodes) == expected, "stored nodes disagree with the RFC's recursion"
    print(
        json.dumps(
            {
                "figure": "tree built in memory",
                "leaves": largest,
                "build_s": round(build_s, 1),
                "nodes": sum(len(level) // 32 for level in tree.levels),
                "bytes": sum(len(level) for level in tree.levels),
                "machine": machine,
            }
        ),
        flush=True,
    )
    rng = random.Random(11)
    for size in sorted(args.sizes):
        print(json.dumps({"figure": "proofs", **measure(tree, size, args.samples, rng)}), flush=True)


if __name__ == "__main__":
    main()
