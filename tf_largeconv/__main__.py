"""`python -m tf_largeconv`: the command line (`tf_largeconv.cli`)."""

import sys

from tf_largeconv.cli import main

if __name__ == "__main__":
  sys.exit(main())
