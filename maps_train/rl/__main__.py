"""`python -m maps_train.rl --config RECIPE [overrides]`: the RL stage as a process `accelerate launch` can start.

    accelerate launch --num_processes 1 -m maps_train.rl --config recipes/demo/demo.yaml rl.grpo.max_steps=20

(One process generates its own rollouts: `rl.rollout: hf`.) `maps-train rl` runs the same function in-process,
after the memory plan of the stage; this entry point sits below the plan: run `maps-train plan RECIPE` first.
"""

from __future__ import annotations

import argparse
import logging
import sys

from maps_train.errors import MapsTrainError
from maps_train.platform import apply_runtime_defaults, exit_cleanly_on_sigterm


def main(argv: list[str] | None = None) -> int:
    from maps_train.recipe import load_recipe
    from maps_train.rl.trainer import rl_stage

    apply_runtime_defaults()
    exit_cleanly_on_sigterm()  # accelerate passes a SIGTERM on to its ranks: their engines stop with them
    parser = argparse.ArgumentParser(prog="python -m maps_train.rl", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="a recipe YAML with an rl: section")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides, e.g. rl.grpo.max_steps=20")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        rl_stage(load_recipe(args.config, args.overrides), echo=print)
    except MapsTrainError as err:
        print(f"maps-train: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
