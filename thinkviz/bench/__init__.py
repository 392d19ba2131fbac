"""Benchmarks: ratios measured in one run against a baseline on the same machine."""
