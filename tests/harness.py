"""The small harness the Python test files share: one line per test ("PASS name",
"FAIL name: reason", "SKIP name: reason"), `-k SUBSTRING` to run only some, and the count
at the end ("N passed, N failed", exit 1 on any failure), which test.sh adds up."""
import os
import sys
import time
import traceback

# what a sanitizer build prints on stderr when it finds something: any glm run whose
# stderr holds one of these fails, whatever its exit code
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error:", "ThreadSanitizer", "MemorySanitizer")

results = []  # True / False per test run (skips are not counted)
only = None  # -k SUBSTRING: run only the tests whose name holds it


class Fail(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def parse_args(prog):
    """Reads -k SUBSTRING; returns 0, or 2 after a usage line for anything else."""
    global only
    args = sys.argv[1:]
    if args[:1] == ["-k"] and len(args) > 1:
        only = args[1]
        return 0
    if args:
        print("usage: %s [-k SUBSTRING]" % prog, file=sys.stderr)
        return 2
    return 0


def test(name, fn, *args):
    if only and only not in name:
        return
    t0 = time.time()
    try:
        note = fn(*args)
        line = "PASS %s" % name + ("  (%s)" % note if note else "")
        results.append(True)
    except Skip as e:
        line = "SKIP %s: %s" % (name, e)
    except Fail as e:
        line = "FAIL %s: %s" % (name, str(e).replace("\n", " | "))
        results.append(False)
    except Exception as e:  # a bug in the test itself or an unexpected condition
        tb = traceback.extract_tb(e.__traceback__)[-1]
        line = "FAIL %s: %s: %s (%s:%d)" % (name, type(e).__name__, str(e).replace("\n", " | "),
                                          os.path.basename(tb.filename), tb.lineno)
        results.append(False)
    dt = time.time() - t0
    print(line + ("" if dt < 2 else "  [%.1fs]" % dt), flush=True)


def summary(label, t0):
    """Prints the time and the count; returns the exit code."""
    n_pass = sum(results)
    n_fail = len(results) - n_pass
    print("%s: %.1f s" % (label, time.time() - t0))
    print("%d passed, %d failed" % (n_pass, n_fail))
    return 1 if n_fail else 0
