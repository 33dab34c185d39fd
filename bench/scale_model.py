#!/usr/bin/env python3
"""scale_model.py - the projection of docs/SCALE.md: a distributed `tokshard
build` of F files of S bytes on N ranks x T threads, from the coordination
costs bench/bench_dist.sh measures on one machine and the encoding rate of
one thread.

The job's time on N ranks is
    T(N) = coord(N) + ceil(units / N) * t_unit
where every unit holds one file (S < --unit-bytes 1 GiB), t_unit = S / (r T)
(r: text bytes per second of one encoding thread; threads scale linearly
within a rank, an assumption: docs/BENCHMARKS.md has the measured thread
scaling), the units are equal so the largest-first hand-out gives each rank
ceil(units / N) of them, and coord(N) is the critical path outside encoding:
    plan         rank 0 lists F files: plan_s * F / plan_files
    hand-outs    one rank's ceil(units / N) + 1 MPI_Fetch_and_op at the mean
                 cost measured, plus one at the worst cost measured
    placing      one rank's shards (shards / N) at the cost per shard the
                 bench measured with all its ranks on one disk (its shards
                 placed one after the other: an upper bound)
    manifest     rank 0: per input file and per shard (CPU, measured on
                 tmpfs), and its bytes written and fsynced at the rate
                 measured on the bench's disk
T(1) is the same job on one rank of T threads; the speed-up is T(1) / T(N).
Printed per N: the time outside encoding on the critical path (coord.,
serial(N) above) and its share of T(N), and the share of T(N) of the part
that does not shrink with N at all (plan + manifest: serial %); and once,
that part as a fraction of T(1) (Amdahl's serial fraction).
"""
import argparse
import math


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--plan", type=float, required=True, help="plan seconds for --plan-files files")
    a.add_argument("--plan-files", type=int, required=True)
    a.add_argument("--manifest-files", type=float, required=True, help="manifest seconds for --plan-files inputs")
    a.add_argument("--handout-us", type=float, required=True, help="mean hand-out, microseconds")
    a.add_argument("--handout-max-us", type=float, required=True, help="worst hand-out, microseconds")
    a.add_argument("--place", type=float, required=True, help="seconds to place --place-shards shards")
    a.add_argument("--place-shards", type=int, required=True)
    a.add_argument("--manifest-per-shard", type=float, required=True, help="manifest CPU seconds per shard")
    a.add_argument("--manifest-bytes-per-shard", type=float, required=True)
    a.add_argument("--write-per-mb", type=float, required=True, help="seconds to write and fsync 1 MB")
    a.add_argument("--rate", type=float, required=True, help="MB/s of text, one thread")
    a.add_argument("--bytes-per-token", type=float, required=True)
    a.add_argument("--files", type=int, default=10000)
    a.add_argument("--file-bytes", type=float, default=1e9)
    a.add_argument("--threads", type=int, default=32)
    a.add_argument("--shard-tokens", type=int, default=16 << 20)
    a.add_argument("--ranks", default="1,16,64,256,1024")
    x = a.parse_args()

    units = x.files
    t_unit = x.file_bytes / (x.rate * 1e6 * x.threads)
    shards_per_unit = math.ceil(x.file_bytes / x.bytes_per_token / x.shard_tokens)
    shards = units * shards_per_unit
    plan = x.plan * x.files / x.plan_files
    per_shard_place = x.place / x.place_shards  # all the bench's ranks on one disk
    manifest_mb = (shards * x.manifest_bytes_per_shard + x.files * 150) / 1e6
    manifest = (x.manifest_files * x.files / x.plan_files + x.manifest_per_shard * shards
                + manifest_mb * x.write_per_mb)
    print(f"projection: {x.files} files of {x.file_bytes / 1e9:g} GB, one unit each, {shards_per_unit} shards "
          f"of {x.shard_tokens >> 20}M tokens per unit ({shards} in all), {x.threads} threads per rank at "
          f"{x.rate:g} MB/s each: a unit takes {t_unit:.2f} s")
    print(f"serial parts: plan {plan:.3f} s; manifest {manifest:.3f} s ({manifest_mb:.0f} MB); a hand-out "
          f"{x.handout_us:.0f} us (worst {x.handout_max_us:.0f} us); a shard placed {per_shard_place * 1e3:.3f} ms")
    serial = plan + manifest  # does not shrink with N
    rows = []
    t1 = None
    for n in [int(v) for v in x.ranks.split(",")]:
        rounds = math.ceil(units / n)
        handouts = (rounds + 1) * x.handout_us / 1e6 + (x.handout_max_us - x.handout_us) / 1e6
        coord = serial + handouts + shards / n * per_shard_place
        total = coord + rounds * t_unit
        if n == 1:
            t1 = total
        rows.append((n, rounds, rounds * t_unit, coord, total))
    print(f"serial (plan + manifest, the same for any N): {serial:.3f} s, {100 * serial / t1:.4f}% of T(1) "
          f"(Amdahl's serial fraction)")
    print(f"{'ranks':>6} {'threads':>8} {'units/rank':>10} {'encode s':>9} {'coord. s':>9} {'total s':>9} "
          f"{'coord. %':>9} {'serial %':>9} {'speed-up':>9} {'efficiency':>10}")
    for n, rounds, enc, coord, total in rows:
        su = t1 / total
        print(f"{n:>6} {n * x.threads:>8} {rounds:>10} {enc:>9.1f} {coord:>9.3f} {total:>9.1f} "
              f"{100 * coord / total:>8.2f}% {100 * serial / total:>8.2f}% {su:>9.1f} {100 * su / n:>9.1f}%")


if __name__ == "__main__":
    main()
