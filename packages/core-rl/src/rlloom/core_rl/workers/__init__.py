"""The models a run trains and queries: actor, critic, reward model, their forward passes, precision, optimizer,
attention kernels and weight sync.
"""
