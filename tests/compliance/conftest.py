"""The auditors' pages read the record that tests/audit's fixtures make: the same fixtures here."""

from tests.audit.conftest import _fast_passwords, audit_files, finished_run  # noqa: F401 (fixtures)
