"""Evaluations: bits-per-byte on held-out code, and the leaderboard over experiments."""
