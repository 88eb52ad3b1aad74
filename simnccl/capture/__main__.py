"""``python -m simnccl.capture``: the same command as ``simnccl capture``."""

import sys

from simnccl.capture.api import main

sys.exit(main())
