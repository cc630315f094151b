"""`maps-train plan`: memory per device and placement for every stage a recipe or suite runs, before any starts.

`shapes` reads a model's sizes (its own config.json where one is at hand, else the shipped files in `models/`),
`memory` turns sizes and a recipe's settings into bytes. Each stage's processes are laid onto the hardware the
recipe names (`hardware:`) by `index`, `engines` (the agent's engines and the student's server), `training` and
`grpo`, each row saying in one line what does not fit, by how much and what to change (`rows`); `stages` plans a
whole recipe or suite, `preflight` the one stage a command runs.
"""
