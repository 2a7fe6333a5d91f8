"""The training config: the schema and its sections, loading with `key=value` overrides, migration of older keys,
and (under `compat/`) veRL's and TRL's names.
"""
