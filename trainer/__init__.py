"""Trainer that runs inside the Ray job."""
