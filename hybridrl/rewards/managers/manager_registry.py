"""The reward manager registry, looked up by `reward_model.reward_manager`."""

from hybridrl.utils.registry import Registry

REWARD_MANAGERS: Registry = Registry("reward manager")
