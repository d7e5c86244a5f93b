"""Verification: recompute every chain, check it against the signed checkpoints read from files (the
trust anchor outside the database), check purges and seals, and compare the operational rows with the
events that describe them. Names the first event that does not hold, with what was expected.

Two ways in:
- `verify()`: everything. Reads events in (chain, seq) order in batches, one chain at a time, and
  checkpoint files one at a time; what must be compared across chains goes to temporary tables that
  the database compares. Its memory is bounded by a batch, not by events, chains or checkpoints.
- `verify(chains=[...])`: one run's proof (its chain, its seal, the checkpoint that covers it, its
  rows), read through indexes: milliseconds, whatever the size of the record. What a dossier shows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from django.conf import settings

from .. import signing
from .full import _verify_all
from .report import Problem, Report, hash_short
from .runs import _verify_runs

RowCheck = Callable[[list[str] | None], Iterable[Problem]]


_ROW_CHECKS: list[RowCheck] = []


def row_check_register(check: RowCheck) -> RowCheck:
    """Register a comparison of an app's rows with the events that describe them. It gets the run
    chains to check (None: all) and yields a Problem per difference. The audit app knows no rows."""
    if check not in _ROW_CHECKS:
        _ROW_CHECKS.append(check)
    return check


def verify(
    *,
    chains: list[str] | None = None,
    use_checkpoint: bool = True,
    checkpoint_dir: Path | str | None = None,
    public_key: Path | str | None = None,
    rows: bool = True,
) -> Report:
    """checkpoint_dir and public_key: the trust anchor (default AUDIT_CHECKPOINT_DIR and the key of
    AUDIT_PUBLIC_KEY_FILE, else the signing key's own)."""
    key = signing.trusted_public_key(public_key)
    if chains is not None:
        report = _verify_runs(chains, key=key, use_checkpoint=use_checkpoint)
    else:
        directory = Path(checkpoint_dir) if checkpoint_dir else settings.AUDIT_CHECKPOINT_DIR
        report = _verify_all(key=key, use_checkpoint=use_checkpoint, directory=directory)
    if rows:
        for check in _ROW_CHECKS:
            report.problems.extend(check(chains))
    return report


__all__ = ["Problem", "Report", "RowCheck", "hash_short", "row_check_register", "verify"]
