"""``python -m simnccl.capture``: the same command as ``simnccl capture``, with its exit codes (``api.main``)."""

import sys

from simnccl.capture.api import main

sys.exit(main())
