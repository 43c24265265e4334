"""``python -m parallax.cli``: ``parallax-run``, as when ``parallax.cli`` was one module run as a script."""

import sys

from parallax.cli.run import main

sys.exit(main())
