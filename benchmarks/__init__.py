"""Benchmark scripts (run as files; importable for the GPU check and its test)."""
