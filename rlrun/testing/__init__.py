"""Test helpers that ship with rlrun: network-namespace hosts (`rlrun.testing.netns`)."""
