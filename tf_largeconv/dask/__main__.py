"""`python -m tf_largeconv.dask`: the slide convolution of the command line
(`tf-largeconv conv`), with its arguments; a first argument ending in .keras runs a Keras
model over the slide (`tf-largeconv model`, whose --read-chunk this command's --chunk is).
The command line itself lives in `tf_largeconv.cli`."""

import sys


def main(argv=None):
  from tf_largeconv.cli import dask_alias

  return dask_alias(argv)


if __name__ == "__main__":
  sys.exit(main())
