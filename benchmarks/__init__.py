"""Benchmarks for Switchyard (not tests): load generator, serving comparison, calibration."""
