"""rlloom scorers inside other RL libraries, without glue: TRL `reward_funcs` (`trl`), a veRL `compute_score`
(`verl`) and verifiers reward functions (`verifiers`).

None of these modules imports its peer library: each adapter is a plain callable with the signature the peer
calls, so `rlloom-rewards` stays torch-free and installs without them.
"""
