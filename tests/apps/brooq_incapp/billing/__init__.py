"""A package named whole in include=: every module under it is imported."""
