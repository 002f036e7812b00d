"""``python -m dkern`` runs the ``dkern`` command."""

import sys

from .cli import main

sys.exit(main())
