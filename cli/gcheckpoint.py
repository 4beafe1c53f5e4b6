"""gcheckpoint: run inside a job after saving a checkpoint, so the scheduler knows how much work a
preemption would lose (it prefers victims that checkpointed recently). Equivalent to touching the file
named by GARRISON_CHECKPOINT_MARK; the node agent reports the time to the controller."""

from __future__ import annotations

import os
import sys


def main() -> None:
    mark = os.environ.get("GARRISON_CHECKPOINT_MARK")
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if not mark:
        print("gcheckpoint: error: not inside a Garrison job (GARRISON_CHECKPOINT_MARK is not set)", file=sys.stderr)
        sys.exit(2)
    try:
        with open(mark, "a"):
            pass
        os.utime(mark)
    except OSError as exc:
        print(f"gcheckpoint: error: cannot mark the checkpoint: {exc.strerror}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
