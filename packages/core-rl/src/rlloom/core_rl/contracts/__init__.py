"""What passes between the trainer, the engines and the rewards: generation types, trajectories, the batch, packing,
the engine Protocols and the one replica dispatcher.
"""
