"""``python -m shardsim.cli``: the `shardsim` command."""

import sys

from shardsim.cli.app import main

sys.exit(main())
