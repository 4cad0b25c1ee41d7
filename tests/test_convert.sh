#!/bin/sh
# glm convert tests (BF16/FP8 -> Quark MXFP4) against tests/quark_ref.py and tests/ref.py;
# see the docstring of tests/test_convert.py
exec /usr/bin/python3 tests/test_convert.py "$@"
