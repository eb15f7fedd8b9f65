"""Variants and queueing math: the variant planner, its online estimators and backlog
prediction, the M/M/c formulas, and one-shot dynamic batching."""
