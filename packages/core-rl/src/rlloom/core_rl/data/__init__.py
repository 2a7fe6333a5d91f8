"""The prompt stream: row files, the stateful loader, samplers, online prompt filtering, user code and supervised
(ptx) rows.
"""
