#!/usr/bin/env python3
"""The load generator's command line: ``python tools/loadgen.py --url http://127.0.0.1:8000 --n 200 --rate 20``.

The code lives in ``tinylearn.serve.loadgen`` (so ``tinylearn bench serving`` and notebook 13 run it from an installed
package too); ``--help`` lists the options."""

import sys

from tinylearn.serve.loadgen import main

if __name__ == "__main__":
    sys.exit(main())
