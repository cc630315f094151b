"""Reinforcement learning on the role adapters (`maps-train rl`): GRPO through TRL's GRPOTrainer with the MAPS
engine as the environment, and the reward of one rollout (`rewards`)."""
