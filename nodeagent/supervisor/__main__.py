"""``python -m garrison.nodeagent.supervisor JOB_DIR [--lock-fd=FD]``: run one supervisor in the foreground.

client.spawn() does not use this entry point: it starts core.py without site-packages, which is faster.
"""

import sys

from .core import main

sys.exit(main(sys.argv[1:]))
