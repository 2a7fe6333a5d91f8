"""The OpenAI API both ways: an engine that calls any compatible endpoint, and a server in front of any engine
(schema, errors).
"""
