"""Reinforcement learning on the role adapters (`maps-train rl`): GRPO through TRL's GRPOTrainer with the MAPS
engine as the environment. `rollout`: branch rollouts (a pilot episode, G branches replaying it up to one freshly
sampled call of the trained adapter); `policy`: the trainer's model as a backend that records the tokens GRPO
trains on; `rewards`: the reward of one rollout as separately logged parts; `trainer`: the GRPOTrainer per role,
its outputs, resume and lineage (docs/rl.md)."""
