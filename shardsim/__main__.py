"""``python -m shardsim``: the `shardsim` command."""

import sys

from shardsim.cli.app import main

sys.exit(main())
