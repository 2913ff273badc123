"""Benchmarks: scripts that print a table and append it to a results file here."""
