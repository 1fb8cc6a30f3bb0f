"""Unit economics: what serving costs, and against what (seed 003 §11)."""
