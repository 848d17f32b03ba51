"""``python -m elastic_bench`` (used under ``torchrun``)."""

import sys

from elastic_bench.cli import main

sys.exit(main())
