#!/usr/bin/python3
"""Independent NumPy implementation of AMD Quark's MXFP4 weight quantization.

Written from docs/FORMATS.md §1.4 and §2.1 only (not from convert.c), to check the
bytes glm convert writes:

    packed, scale = quantize(w)      w: float32 [rows, cols], cols a multiple of 32
                                     packed: uint8 [rows, cols/2], element 2i in the low nibble
                                     scale:  uint8 [rows, cols/32], E8M0 (2^(s-127))

The rule, per block of 32 consecutive elements of a row:
  1. amax = max |x|.
  2. "even" scale: add 0x00200000 to the fp32 bit pattern of amax, clear the 23 mantissa
     bits, e = floor(log2(that)) - 2, clamped to [-127, 127] (amax 0 -> log2 = -inf -> -127;
     amax that rounds up to infinity -> +inf -> 127). Scale byte = e + 127.
  3. each element x * 2^-e (computed exactly here, in float64) goes to the nearest E2M1 value
     0 0.5 1 1.5 2 3 4 6, a tie to the neighbour whose code is even (mantissa bit 0), and
     magnitudes above 6 saturate to 6. The sign bit is the input's sign bit (Quark's packer
     reads bit 31 of the float), so -0.0 and negatives that round to zero are code 8.
NaN or infinity in the input is an error.

    quark_ref.py selftest      checks the tie table and a few hand-worked blocks
"""
import sys

import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def even_exponent(amax):
    """float32 amax [...] -> int64 shared exponents e [...] (Quark 'even' mode)."""
    amax = np.ascontiguousarray(amax, dtype=np.float32)
    bits = amax.view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x00200000) & 0xFF800000).astype(np.uint32)
    rounded = bits.view(np.float32).astype(np.float64)  # 0, a power of two, or +inf
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(rounded)) - 2
    return np.clip(e, -127, 127).astype(np.int64)


def e2m1_magnitude_code(a):
    """|q| float64 [...] -> 3-bit codes: nearest grid point, ties to the even code, saturate."""
    a = np.minimum(a, 6.0)
    lo = np.searchsorted(E2M1, a, side="right") - 1       # largest grid index with E2M1[lo] <= a
    lo = np.clip(lo, 0, 7)
    hi = np.minimum(lo + 1, 7)
    below = a - E2M1[lo]
    above = E2M1[hi] - a
    code = np.where(below < above, lo, hi)
    tie = (below == above) & (hi != lo)
    code = np.where(tie, np.where(lo % 2 == 0, lo, hi), code)
    return code.astype(np.uint8)


def quantize(w):
    """w float32 [rows, cols] -> (packed uint8 [rows, cols/2], scale uint8 [rows, cols/32])."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % 32:
        raise ValueError("need a 2-D array whose last dimension is a multiple of 32, got %s" % (w.shape,))
    if not np.isfinite(w).all():
        raise ValueError("NaN or infinity in the input")
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    e = even_exponent(np.abs(blocks).max(axis=2))
    q = blocks.astype(np.float64) * np.ldexp(1.0, -e)[..., None]
    codes = e2m1_magnitude_code(np.abs(q)) | np.where(np.signbit(blocks), 8, 0).astype(np.uint8)
    codes = codes.reshape(rows, cols)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def dequantize(packed, scale):
    """the inverse map, for sanity checks: float64 [rows, cols]."""
    codes = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    codes[:, 0::2] = packed & 15
    codes[:, 1::2] = packed >> 4
    vals = E2M1[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    return vals * np.repeat(np.ldexp(1.0, scale.astype(np.int64) - 127), 32, axis=1)


def selftest():
    # the tie table of docs/FORMATS.md §1.4, with amax 4 so that e = 0
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    row = np.zeros(32, np.float32)
    row[0] = 4.0
    row[1:8] = ties
    row[8:15] = [-t for t in ties]
    p, s = quantize(row[None])
    assert s[0, 0] == 127, s
    got = dequantize(p, s)[0]
    assert list(got[1:8]) == want and list(got[8:15]) == [-v for v in want], got
    # amax 0: byte 0 and zero codes; -0.0 keeps its sign bit
    z = np.zeros((1, 32), np.float32)
    z[0, 1] = -0.0
    p, s = quantize(z)
    assert s[0, 0] == 0 and p[0, 0] == 0x80 and not p[0, 1:].any(), (p, s)
    # amax 7 = 1.75 * 4 rounds to 8: e = 1, 7 / 2 = 3.5 -> 4 (a tie), so 7 -> 8
    p, s = quantize(np.array([[7.0] + [0.0] * 31], np.float32))
    assert s[0, 0] == 128 and dequantize(p, s)[0, 0] == 8.0
    # just below 7: e = 0, saturates to 6
    p, s = quantize(np.array([[np.nextafter(np.float32(7), np.float32(0))] + [0.0] * 31], np.float32))
    assert s[0, 0] == 127 and dequantize(p, s)[0, 0] == 6.0
    # fp32 max: rounds to infinity, e clamps to 127
    p, s = quantize(np.array([[np.finfo(np.float32).max] + [0.0] * 31], np.float32))
    assert s[0, 0] == 254 and dequantize(p, s)[0, 0] == 2.0 ** 128
    # subnormal block: e = -127, byte 0
    p, s = quantize(np.array([[1e-40] * 32], np.float32))
    assert s[0, 0] == 0
    print("quark_ref selftest ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["selftest"]:
        selftest()
    else:
        print(__doc__)
