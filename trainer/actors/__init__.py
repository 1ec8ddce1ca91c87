"""Ray actor groups: ranked workers on a placement group (policy, reference, critic)."""
