"""Records the arguments it was given and writes outputs as tutorial scripts do (test fixture)."""

import json
import os
import sys
from pathlib import Path

import horovod.tensorflow as hvd

hvd.init()
if hvd.rank() == 0:
    Path("args.json").write_text(json.dumps(sys.argv[1:]))
    Path("logs").mkdir(exist_ok=True)
    Path("logs/run.txt").write_text(f"{hvd.size()} ranks\n")
    Path(os.environ["EDGETRAIN_OUTPUT_DIR"], "model.txt").write_text("weights\n")
    Path("data.txt").write_text("changed by rank 0\n")
print(f"rank {hvd.rank()} of {hvd.size()} in {os.getcwd()} saw {sys.argv[1:]}", flush=True)
