"""Third-party config names: veRL's Hydra keys as aliases, TRL's field names as hints, and the generated table of
both.
"""
