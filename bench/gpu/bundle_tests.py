#!/usr/bin/env python3
"""bundle_tests.py - the bundle's CTestTestfile.cmake, made from the build's own.

Usage: bundle_tests.py BUILD/tests/CTestTestfile.cmake SRC_DIR BUILD_DIR > CTestTestfile.cmake

Keeps the tests a GPU machine runs (every test labelled gpu) with the fixture
they need and the CPU checks beside them (one process and under mpirun), so
the bundle's list can never drift from the build's. Absolute paths of this
machine become placeholders that tests/run-test.sh fills in on the target
(@BIN@ the bundle's bin/, @TESTS@ its tests/, @WORK@ a scratch folder), and
each command runs through run-test.sh, which sets up the bundle's environment.
"""
import re
import sys

CPU = {"train_setup", "ops", "model", "comm_unit", "comm_mpi", "train_train", "parallel_layouts"}


def main():
    src_file, srcdir, build = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3].rstrip("/")
    text = open(src_file).read()
    out = ["# The tests of a tokshard bundle (bench/gpu/bundle.sh made this file from the",
           "# build's own list). Run: ./env ctest --test-dir tests [-L gpu | -LE gpu]", ""]
    names = []
    for m in re.finditer(r"^add_test\(\[=\[([^\]]+)\]=\] (.*)\)$\n^set_tests_properties\(\[=\[\1\]=\] PROPERTIES (.*)\)$",
                         text, re.M):
        name, cmd, props = m.group(1), m.group(2), m.group(3)
        gpu = re.search(r'LABELS "[^"]*gpu', props) is not None
        if not gpu and name not in CPU:
            continue
        cmd = (cmd.replace(srcdir + "/tests/", "@TESTS@/")
               .replace(build + "/tests/cuda_model.d", "@WORK@/cuda_model.d")
               .replace(build + "/test-work", "@WORK@")
               .replace(build + "/bin", "@BIN@"))
        if srcdir in cmd or build in cmd:
            sys.exit("bundle_tests.py: test %s names a path of this machine the bundle cannot carry: %s"
                     % (name, cmd))
        props = re.sub(r' _BACKTRACE_TRIPLES "[^"]*"', "", props)
        if not gpu:
            props += ' LABELS "cpu"'
        out.append('add_test([=[%s]=] "bash" "run-test.sh" %s)' % (name, cmd))
        out.append("set_tests_properties([=[%s]=] PROPERTIES %s)" % (name, props))
        names.append(name)
    missing = CPU - set(names)
    if missing:
        sys.exit("bundle_tests.py: the build has no test %s" % ", ".join(sorted(missing)))
    print("\n".join(out))


if __name__ == "__main__":
    main()
