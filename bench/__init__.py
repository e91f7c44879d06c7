"""Benchmarks (not tests): each prints its numbers and writes bench/results/<name>.json."""
