"""The embedded transformers engine: `HFEngine`, its decode loop with continuous batching, KV and prefix caches,
sampling and stop strings.
"""
