"""Shared helpers of the fault and security suites (tests/e2e/test_faults.py, test_security.py)."""
