"""Trainers run on the driver: the PPO/GRPO fit loop, SFT, generation and their Hydra entry points."""
