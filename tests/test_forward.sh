#!/bin/sh
# forward-pass tests of ./glm (or $GLM) against the NumPy reference; see tests/README.md
export GLM_PRECISION="${GLM_PRECISION:-fp32}" # compared with an fp32 reference (see test.sh)
exec /usr/bin/python3 tests/test_forward.py "$@"
