"""vLLM engines (in-process offline, async for agents, an external server) sharing one weight-sync lifecycle, plus
vLLM's worker extension and image requests.
"""
