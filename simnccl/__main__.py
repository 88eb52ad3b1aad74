"""``python -m simnccl`` is the ``simnccl`` command."""

import sys

from simnccl.cli import main

sys.exit(main())
