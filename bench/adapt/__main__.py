"""`python -m bench.adapt`: the stream through two servers, `--adapt` off and on (bench/adapt/run.py)."""

import sys

from bench.adapt.run import main

if __name__ == "__main__":
    sys.exit(main())
