#!/bin/sh
# glm convert tests (BF16/FP8 -> Quark MXFP4) against tests/quark_ref.py and tests/ref.py;
# see the docstring of tests/test_convert.py
export GLM_PRECISION="${GLM_PRECISION:-fp32}" # compared with an fp32 reference (see test.sh)
exec /usr/bin/python3 tests/test_convert.py "$@"
