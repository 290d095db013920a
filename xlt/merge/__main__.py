"""Merges checkpoint files from a small config (configs/merge_files.py):

  python -m xlt.merge --config=configs/merge_files.py --config.output=runs/swapped

The config names the inputs ({role: path}), the method, its options, the naming ("auto",
"hf" or "xlt") and the output directory, which receives model.safetensors, the delta
heatmaps (with a base among the inputs) and summary.json.
"""

import json
import os

from absl import app, flags
from ml_collections import config_flags

from xlt.merge import files

_CONFIG = config_flags.DEFINE_config_file("config", None, "merge config file", lock_config=True)


def main(argv):
  del argv
  c = _CONFIG.value
  inputs = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in c.inputs.items()}
  summary = files.merge_files(inputs, c.method, c.output, dict(c.get("options", {})),
                              naming=c.get("naming", "auto"), heatmaps=c.get("heatmaps", True))
  with open(os.path.join(c.output, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
  print(json.dumps(summary, indent=1))


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
