"""Stand-ins for Slurm's sbatch, squeue, scancel and sinfo: one script, by the name it is called as,
over a queue kept in a JSON file (SLURM_STANDIN). Enough of each command's behaviour for edgetrain's
Slurm paths without daemons: squeue's --format (%i %j %T %u %D %N %r) and --me, sbatch --parsable
reading its script from standard input. Every call is recorded (scancel's only effect here: the tests
ask which jobs it was told to signal, as root may signal anyone's)."""

from __future__ import annotations

import json
import os
import pwd
import sys
import time
from pathlib import Path

FIELDS = {"i": "id", "j": "name", "T": "state", "u": "user", "D": "nodes", "N": "nodelist", "r": "reason"}


def main(command: str) -> int:
    state_file = Path(os.environ["SLURM_STANDIN"])
    state = json.loads(state_file.read_text())
    args = sys.argv[1:]
    me = pwd.getpwuid(os.getuid()).pw_name
    state["calls"].append([command, *args])
    if command == "sbatch":
        state["scripts"].append(sys.stdin.read())
    state_file.write_text(json.dumps(state))
    time.sleep(state.get("sleep", {}).get(command, 0))
    if command == "squeue":
        fmt = next(a.split("=", 1)[1] for a in args if a.startswith("--format="))
        for job in sorted(state["jobs"], key=lambda j: int(j["id"])):
            if "--me" in args and job["user"] != me:
                continue
            line = fmt
            for key, field in FIELDS.items():
                line = line.replace(f"%{key}", str(job[field]))
            print(line)
    elif command == "sbatch":
        job_id = str(state["next_id"])
        name = next(a.split("=", 1)[1] for a in args if a.startswith("--job-name="))
        nodes = next(a.split("=", 1)[1] for a in args if a.startswith("--nodes="))
        state["jobs"].append({"id": job_id, "name": name, "state": "PENDING", "user": me, "nodes": nodes, "nodelist": "", "reason": "Priority"})
        state["next_id"] += 1
        state_file.write_text(json.dumps(state))
        print(job_id)
    elif command == "sinfo":
        for name, node_state in state.get("nodes", {}).items():
            print(f"{name}|{node_state}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[0]).name))
