#!/bin/sh
# repeat.sh N CMD...: runs CMD N times (stdout discarded), stops at the first failure.
n=$1
shift
i=0
while [ "$i" -lt "$n" ]; do
  "$@" > /dev/null || exit 1
  i=$((i + 1))
done
