"""Runs a test module's test_* functions as a script: `ok`/`FAIL` per test,
'N passed, N failed' at the end, an exit status for CI. Arguments on the
command line keep only the tests whose names contain one of them."""

import sys
import time
import traceback


def run(namespace, cleanup):
    tests = [(k, v) for k, v in sorted(namespace.items()) if k.startswith("test_") and callable(v)]
    only = sys.argv[1:]
    passed = failed = 0
    try:
        for name, fn in tests:
            if only and not any(o in name for o in only):
                continue
            t0 = time.time()
            try:
                fn()
                passed += 1
                print(f"ok   {name} ({time.time() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {name}", flush=True)
                traceback.print_exc()
    finally:
        cleanup()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
