#!/bin/sh
# forward-pass tests of ./glm (or $GLM) against the NumPy reference; see tests/README.md
exec /usr/bin/python3 tests/test_forward.py "$@"
