"""``python -m dkern.cli`` runs the ``dkern`` command, as ``python -m dkern`` does."""

import sys

from . import main

sys.exit(main())
