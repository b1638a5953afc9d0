"""``python -m services.cli``: the same as the ``loopwire`` console script."""

import sys

from services.cli.app import main

sys.exit(main())
