"""TrajectoryStore: append-only, versioned JSONL of trajectories, written a whole group at a time."""

from agentrl.store.jsonl import LineError, TrajectoryStore, encode_trajectory, iter_records, read_trajectories
from agentrl.store.stats import summarize

__all__ = ["LineError", "TrajectoryStore", "encode_trajectory", "iter_records", "read_trajectories", "summarize"]
