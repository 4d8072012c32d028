"""Benchmarks that compose several layers (`enkflow bench ...`)."""
