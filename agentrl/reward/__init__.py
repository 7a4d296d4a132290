"""Rewards: pure functions of a stored trajectory. Imports only types."""

from agentrl.reward.unit_tests import length_shaped, score, unit_test_fraction

__all__ = ["length_shaped", "score", "unit_test_fraction"]
