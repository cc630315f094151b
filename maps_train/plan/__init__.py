"""`maps-train plan`: memory per device and placement for every stage a recipe or suite runs, before any starts.

`shapes` reads a model's sizes (its own config.json where one is at hand, else the shipped files in `models/`),
`memory` turns sizes and a recipe's settings into bytes, `stages` lays each stage's processes onto the hardware
the recipe names (`hardware:`) and says in one line what does not fit, by how much and what to change.
"""
